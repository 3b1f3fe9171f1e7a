package main

// The report: raw samples, the summary per figure, the table on stdout and
// the JSON file.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
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

// FigureSummary is the spread of one figure per variant.
type FigureSummary struct {
	Title         string             `json:"title"`
	Unit          string             `json:"unit"`
	LowerIsBetter bool               `json:"lowerIsBetter"`
	Variants      map[string]Summary `json:"variants"`
}

// ComparisonResult is one ratio of medians, subject over baseline, and the
// issue's target for it when there is one.
type ComparisonResult struct {
	Subject  string   `json:"subject"`
	Baseline string   `json:"baseline"`
	Figure   string   `json:"figure"`
	Ratio    *float64 `json:"ratio"`            // absent when a median is missing
	Op       string   `json:"op,omitempty"`     // >=, >, <=, <; "" when informational
	Target   float64  `json:"target,omitempty"` // what Ratio must be Op
	Met      *bool    `json:"met,omitempty"`    // absent when informational
}

// VariantInfo describes a scenario (a variant of the comparison) in the
// report.
type VariantInfo struct {
	Name        string   `json:"name"`
	Description string   `json:"description"`
	DstIPs      []string `json:"dstIPs"` // one per pair
}

// cpuAccounting says in the JSON what the cpu figure counts (cpu.go says why).
const cpuAccounting = "cpu: busy CPU-seconds of the whole machine (/proc/stat user+nice+system+irq+softirq, all CPUs) " +
	"from the moment every iperf3 client runs until the last exits, per GB (1e9 bytes) the receivers got; " +
	"extra.user/system/softirq/irq split it per GB, extra.endpoints is the iperf3 processes' own share per GB " +
	"(their cgroup v2 cpu.stat), extra.labs the labs' daemons' (processes whose command line names the state root), " +
	"extra.ksoftirqd the ksoftirqd threads', extra.own those three together, extra.elsewhere the rest " +
	"(softirq over idle, anything else running), extra.idle and extra.steal are CPU-seconds " +
	"and extra.idleShare idle's share of all CPU time in the window"

// Report is the JSON the bench writes: configuration, every raw sample, and
// the summary.
type Report struct {
	Started       time.Time                `json:"started"`
	Finished      time.Time                `json:"finished"`
	Rounds        int                      `json:"rounds"`
	TestSeconds   int                      `json:"testSeconds"`
	Pings         int                      `json:"pings"`
	PingInterval  string                   `json:"pingInterval"`
	UDPLength     int                      `json:"udpLength"`
	Quick         bool                     `json:"quick"`
	CPUAccounting string                   `json:"cpuAccounting"`
	Host          map[string]string        `json:"host"`
	Variants      []VariantInfo            `json:"variants"`
	Samples       []Sample                 `json:"samples"`
	Summary       map[string]FigureSummary `json:"summary"`
	Comparisons   []ComparisonResult       `json:"comparisons"`
	Checks        []Check                  `json:"checks,omitempty"`

	comparisons []comparison // what summarize computes into Comparisons
}

func newReport(cfg config, comps []comparison) *Report {
	r := &Report{Rounds: cfg.rounds, TestSeconds: cfg.seconds, Pings: cfg.pings, PingInterval: pingGap + "s",
		UDPLength: udpLen, Quick: cfg.quick, CPUAccounting: cpuAccounting,
		Host: map[string]string{"cpus": strconv.Itoa(runtime.NumCPU())}, comparisons: comps}
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
		fs := FigureSummary{Title: f.title, Unit: f.baseUnit, LowerIsBetter: f.lowerIsBetter, Variants: map[string]Summary{}}
		for _, v := range r.Variants {
			if xs := r.values(f.key, v.Name); len(xs) > 0 {
				fs.Variants[v.Name] = Summarize(xs)
			}
		}
		r.Summary[f.key] = fs
	}
	r.Comparisons = nil
	for _, c := range r.comparisons {
		f, _ := figureByKey(c.figure)
		vs := r.Summary[c.figure].Variants
		res := ComparisonResult{Subject: c.subject, Baseline: c.baseline, Figure: c.figure}
		if c.target != 0 {
			res.Op, res.Target = targetOp(f.lowerIsBetter, c.strict), c.target
		}
		ratio := Ratio(vs[c.subject].Median, vs[c.baseline].Median)
		if !math.IsNaN(ratio) { // JSON has no NaN: a missing ratio is absent
			res.Ratio = &ratio
		}
		if c.target != 0 {
			met := MeetsTarget(ratio, c.target, f.lowerIsBetter)
			if c.strict && ratio == c.target {
				met = false
			}
			res.Met = &met
		}
		r.Comparisons = append(r.Comparisons, res)
	}
}

func targetOp(lowerIsBetter, strict bool) string {
	switch {
	case lowerIsBetter && strict:
		return "<"
	case lowerIsBetter:
		return "<="
	case strict:
		return ">"
	}
	return ">="
}

// print writes the human-readable tables: each figure per variant, then
// each comparison with its target.
func (r *Report) print(w io.Writer) {
	fmt.Fprintf(w, "\nonehop and its baselines, side by side (%d interleaved round(s); iperf3 %d s per test;\n", r.Rounds, r.TestSeconds)
	fmt.Fprintf(w, "RTT = avg of %d pings %s s apart; UDP payload %d B; two-pair variants run both pairs at once;\n", r.Pings, pingGap, udpLen)
	fmt.Fprintf(w, "CPU = busy time of the whole machine during the TCP test over the bytes received)\n\n")
	for _, v := range r.Variants {
		fmt.Fprintf(w, "  %-9s %s\n", v.Name, v.Description)
	}
	fmt.Fprintln(w)
	rows := [][]string{{"figure", "variant", "min", "median", "max"}}
	for _, f := range figures {
		fs := r.Summary[f.key]
		better := "higher is better"
		if f.lowerIsBetter {
			better = "lower is better"
		}
		// Only the variants that measured this figure (rr and crr are
		// run only where a scenario asks for them).
		var measured []VariantInfo
		for _, v := range r.Variants {
			if fs.Variants[v.Name].N > 0 {
				measured = append(measured, v)
			}
		}
		for i, v := range measured {
			s := fs.Variants[v.Name]
			label := ""
			switch i {
			case 0:
				label = fmt.Sprintf("%s (%s)", f.title, f.unit)
			case 1:
				label = "  " + better
			}
			num := func(x float64) string {
				if s.N == 0 {
					return "-" // not measured (Scenario.Tests)
				}
				return strconv.FormatFloat(x/f.scale, 'f', f.digits, 64)
			}
			rows = append(rows, []string{label, v.Name, num(s.Min), num(s.Median), num(s.Max)})
		}
	}
	fmt.Fprint(w, renderTable(rows, []bool{false, false, true, true, true}))
	r.printCPUSplit(w)

	fmt.Fprintln(w)
	rows = [][]string{{"comparison", "figure", "ratio of medians", "target", ""}}
	for _, c := range r.Comparisons {
		ratio, verdict := "n/a", ""
		if c.Ratio != nil {
			ratio = fmt.Sprintf("%.2fx", *c.Ratio)
		}
		if c.Met != nil {
			verdict = "MISS"
			if *c.Met {
				verdict = "PASS"
			}
		}
		target := "(informational)"
		if c.Op != "" {
			target = fmt.Sprintf("%s %.2fx", c.Op, c.Target)
		}
		rows = append(rows, []string{c.Subject + " / " + c.Baseline, c.Figure, ratio, target, verdict})
	}
	if len(r.Comparisons) == 0 {
		rows = append(rows, []string{"(none: no scenario ran beside its baseline)", "", "", "", ""})
	}
	fmt.Fprint(w, renderTable(rows, []bool{false, false, true, false, false}))
	fmt.Fprintln(w, "\nEach ratio is the subject's median over the baseline's. Throughput and UDP rate: higher is")
	fmt.Fprintln(w, "better. RTT and CPU per GB: lower is better, so there a target is an upper bound. PASS/MISS are")
	fmt.Fprintln(w, "informational. CPU per GB counts the whole machine: anything else running inflates it (the split's\n"+
		"elsewhere column shows how much).")
	if len(r.Checks) > 0 {
		fmt.Fprintln(w)
		rows = [][]string{{"check", "", "value", "target", ""}}
		for _, c := range r.Checks {
			target, verdict := "(informational)", ""
			if c.Op != "" {
				target = fmt.Sprintf("%s %g %s", c.Op, c.Target, c.Unit)
			}
			if c.Met != nil {
				verdict = "MISS"
				if *c.Met {
					verdict = "PASS"
				}
			}
			rows = append(rows, []string{c.Scenario, c.Name, fmt.Sprintf("%.2f %s", c.Value, c.Unit), target, verdict})
		}
		fmt.Fprint(w, renderTable(rows, []bool{false, false, true, false, false}))
		for _, c := range r.Checks {
			if c.Detail != "" {
				fmt.Fprintf(w, "  %s %s: %s\n", c.Scenario, c.Name, c.Detail)
			}
		}
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range r.Samples {
		lo, hi = math.Min(lo, s.Load1), math.Max(hi, s.Load1)
	}
	if len(r.Samples) > 0 {
		fmt.Fprintf(w, "1-minute load average during the run: %.2f-%.2f on %s CPUs (expect +-20-30%% run to run).\n", lo, hi, r.Host["cpus"])
	}
}

// cpuSplitKeys are the parts of the cpu figure shown per variant, in
// CPU-s per GB (see CPUCost).
var cpuSplitKeys = []string{"user", "system", "softirq", "irq", "endpoints", "labs", "ksoftirqd", "own", "elsewhere"}

// printCPUSplit shows where the CPU time per GB went, medians over the
// rounds, and how idle the machine was during the transfers.
func (r *Report) printCPUSplit(w io.Writer) {
	rows := [][]string{append(append([]string{"CPU per GB, split (CPU-ms/GB, medians)", "variant"}, cpuSplitKeys...), "idle")}
	for i, v := range r.Variants {
		extras := map[string][]float64{}
		for _, s := range r.Samples {
			if s.Figure != "cpu" || s.Variant != v.Name {
				continue
			}
			for k, x := range s.Extra {
				extras[k] = append(extras[k], x)
			}
		}
		if len(extras) == 0 {
			continue
		}
		label := ""
		if i == 0 {
			label = "  endpoints: iperf3's cgroup; labs: their daemons; own: both + ksoftirqd"
		}
		row := []string{label, v.Name}
		for _, k := range cpuSplitKeys {
			cell := "n/a"
			if xs := extras[k]; len(xs) > 0 {
				cell = strconv.FormatFloat(Summarize(xs).Median*1e3, 'f', 0, 64)
			}
			row = append(row, cell)
		}
		idle := "n/a"
		if xs := extras["idleShare"]; len(xs) > 0 {
			idle = strconv.FormatFloat(Summarize(xs).Median*100, 'f', 0, 64) + "%"
		}
		rows = append(rows, append(row, idle))
	}
	if len(rows) == 1 {
		return
	}
	fmt.Fprintln(w)
	right := []bool{false, false}
	for range cpuSplitKeys {
		right = append(right, true)
	}
	fmt.Fprint(w, renderTable(rows, append(right, true)))
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
