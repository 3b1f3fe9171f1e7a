package main

// The report: raw samples, the summary per figure, the table on stdout and
// the JSON file.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// Sample is one measurement of one figure of one variant.
type Sample struct {
	Round   int                `json:"round"`
	Slot    int                `json:"slot"` // the variant's place in this round's order, from 1
	Variant string             `json:"variant"`
	Figure  string             `json:"figure"`
	Value   float64            `json:"value"`
	Unit    string             `json:"unit"`
	Extra   map[string]float64 `json:"extra,omitempty"`
	Retried bool               `json:"retried,omitempty"`
	At      time.Time          `json:"at"`
	Load1   float64            `json:"load1"`
}

// FigureSummary is the result for one figure: the spread per variant and
// onehop's ratio of medians to each baseline.
type FigureSummary struct {
	Title         string             `json:"title"`
	Unit          string             `json:"unit"`
	LowerIsBetter bool               `json:"lowerIsBetter"`
	Variants      map[string]Summary `json:"variants"`
	// RatioOfMedians is onehop's median over each baseline's, for every
	// figure (for RTT too: there, below 1 means onehop is faster). Absent
	// when a median is missing.
	RatioOfMedians map[string]float64 `json:"ratioOfMedians"`
	Target         Target             `json:"target"`
}

// Target is the goal for a figure, and whether this run met it.
type Target struct {
	Baseline string   `json:"baseline"`
	Want     string   `json:"want"` // e.g. "onehop/bridge >= 1.00"
	Ratio    *float64 `json:"ratio"`
	Met      bool     `json:"met"`
}

// Report is the JSON the bench writes: configuration, every raw sample, and
// the summary.
type Report struct {
	Started      time.Time                `json:"started"`
	Finished     time.Time                `json:"finished"`
	Rounds       int                      `json:"rounds"`
	TestSeconds  int                      `json:"testSeconds"`
	Pings        int                      `json:"pings"`
	PingInterval string                   `json:"pingInterval"`
	UDPLength    int                      `json:"udpLength"`
	Quick        bool                     `json:"quick"`
	Host         map[string]string        `json:"host"`
	Variants     []VariantInfo            `json:"variants"`
	Samples      []Sample                 `json:"samples"`
	Summary      map[string]FigureSummary `json:"summary"`
}

func newReport(cfg config) *Report {
	r := &Report{Rounds: cfg.rounds, TestSeconds: cfg.seconds, Pings: cfg.pings, PingInterval: pingGap + "s",
		UDPLength: udpLen, Quick: cfg.quick, Host: map[string]string{"cpus": strconv.Itoa(runtime.NumCPU())}}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		r.Host["kernel"] = strings.TrimSpace(string(b))
	}
	if out, err := exec.Command("iperf3", "--version").Output(); err == nil {
		r.Host["iperf3"], _, _ = strings.Cut(string(out), "\n")
	}
	// Which code was measured: the commit of the working directory (the repo
	// when run by `make bench`), marked dirty if it has local changes.
	if out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output(); err == nil {
		rev := strings.TrimSpace(string(out))
		if st, err := exec.Command("git", "--no-optional-locks", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(bytes.TrimSpace(st)) > 0 {
			rev += "-dirty"
		}
		r.Host["commit"] = rev
	}
	r.Host["binary"] = cfg.binary
	return r
}

func (r *Report) add(s Sample) { r.Samples = append(r.Samples, s) }

func (r *Report) values(fig, variant string) []float64 {
	var out []float64
	for _, s := range r.Samples {
		if s.Figure == fig && s.Variant == variant {
			out = append(out, s.Value)
		}
	}
	return out
}

func (r *Report) summarize() {
	r.Summary = map[string]FigureSummary{}
	for _, f := range figures {
		fs := FigureSummary{Title: f.title, Unit: f.baseUnit, LowerIsBetter: f.lowerIsBetter,
			Variants: map[string]Summary{}, RatioOfMedians: map[string]float64{}}
		for _, v := range r.Variants {
			fs.Variants[v.Name] = Summarize(r.values(f.key, v.Name))
		}
		op := ">="
		if f.lowerIsBetter {
			op = "<="
		}
		fs.Target = Target{Baseline: targetBaseline, Want: fmt.Sprintf("onehop/%s %s %.2f", targetBaseline, op, f.target)}
		for _, v := range r.Variants {
			if v.Name == "onehop" {
				continue
			}
			ratio := Ratio(fs.Variants["onehop"].Median, fs.Variants[v.Name].Median)
			if math.IsNaN(ratio) {
				continue // JSON has no NaN; a missing ratio is an absent key
			}
			fs.RatioOfMedians[v.Name] = ratio
			if v.Name == targetBaseline {
				fs.Target.Ratio = &ratio
				fs.Target.Met = MeetsTarget(ratio, f.target, f.lowerIsBetter)
			}
		}
		r.Summary[f.key] = fs
	}
}

// print writes the human-readable table.
func (r *Report) print(w *os.File) {
	fmt.Fprintf(w, "\nonehop vs baselines: %s -> %s across two hosts (onehop, bridge) and one veth pair (veth)\n", srcVM, dstVM)
	fmt.Fprintf(w, "%d interleaved round(s); iperf3 %d s per test; RTT = avg of %d pings %s s apart; UDP payload %d B\n\n",
		r.Rounds, r.TestSeconds, r.Pings, pingGap, udpLen)
	rows := [][]string{{"figure", "variant", "min", "median", "max", "onehop/variant", "target (vs bridge)"}}
	for _, f := range figures {
		fs := r.Summary[f.key]
		better := "higher is better"
		if f.lowerIsBetter {
			better = "lower is better"
		}
		for i, v := range r.Variants {
			s := fs.Variants[v.Name]
			label := ""
			switch i {
			case 0:
				label = fmt.Sprintf("%s (%s)", f.title, f.unit)
			case 1:
				label = "  " + better
			}
			ratio, target := "", ""
			if v.Name != "onehop" {
				ratio = "n/a"
				if x, ok := fs.RatioOfMedians[v.Name]; ok {
					ratio = fmt.Sprintf("%.2fx", x)
				}
				if v.Name == targetBaseline {
					verdict := "MISS"
					if fs.Target.Met {
						verdict = "PASS"
					}
					op := ">="
					if f.lowerIsBetter {
						op = "<="
					}
					target = fmt.Sprintf("%s %.2fx  %s", op, f.target, verdict)
				}
			}
			num := func(x float64) string { return strconv.FormatFloat(x/f.scale, 'f', f.digits, 64) }
			rows = append(rows, []string{label, v.Name, num(s.Min), num(s.Median), num(s.Max), ratio, target})
		}
	}
	fmt.Fprint(w, renderTable(rows, []bool{false, false, true, true, true, true, false}))
	fmt.Fprintln(w, "\nonehop/variant is onehop's median over the variant's median. Throughput and UDP rate:")
	fmt.Fprintln(w, "higher is better, the target is onehop >= 1.00x bridge. RTT: lower is better, the ratio is")
	fmt.Fprintln(w, "still onehop/baseline, so the target is onehop <= 1.05x bridge. PASS/MISS are informational.")
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range r.Samples {
		lo, hi = math.Min(lo, s.Load1), math.Max(hi, s.Load1)
	}
	if len(r.Samples) > 0 {
		fmt.Fprintf(w, "1-minute load average during the run: %.2f-%.2f on %s CPUs (expect +-20-30%% run to run).\n", lo, hi, r.Host["cpus"])
	}
}

// renderTable aligns rows in columns, right-aligning those marked in right.
func renderTable(rows [][]string, right []bool) string {
	width := make([]int, len(right))
	for _, row := range rows {
		for i, c := range row {
			width[i] = max(width[i], len([]rune(c)))
		}
	}
	var sb strings.Builder
	for _, row := range rows {
		var line strings.Builder
		for i, c := range row {
			pad := strings.Repeat(" ", width[i]-len([]rune(c)))
			if right[i] {
				line.WriteString(pad + c)
			} else {
				line.WriteString(c + pad)
			}
			line.WriteString("  ")
		}
		sb.WriteString(strings.TrimRight(line.String(), " ") + "\n")
	}
	return sb.String()
}

// write saves the report as JSON, atomically, creating the directory.
func (r *Report) write(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
