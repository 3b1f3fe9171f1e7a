package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// summarize turns samples into ratios of medians and target verdicts; RTT
// is lower-is-better, so there a ratio below the target passes.
func TestReportSummarize(t *testing.T) {
	r := &Report{Variants: []VariantInfo{{Name: "onehop"}, {Name: "bridge"}, {Name: "veth"}}}
	add := func(fig, v string, xs ...float64) {
		for i, x := range xs {
			r.add(Sample{Round: i + 1, Figure: fig, Variant: v, Value: x})
		}
	}
	add("tcp", "onehop", 20e9, 22e9, 18e9)
	add("tcp", "bridge", 21e9, 19e9, 20e9)
	add("tcp", "veth", 25e9, 25e9, 25e9)
	add("rtt", "onehop", 100, 90, 110)
	add("rtt", "bridge", 90, 95, 85)
	add("rtt", "veth", 50, 50, 50)
	add("udp64", "onehop", 90e3, 95e3, 99e3) // bridge has no udp64 samples
	r.summarize()

	for _, c := range []struct {
		fig, baseline string
		want          float64
		hasRatio      bool
	}{
		{"tcp", "bridge", 1.0, true},
		{"tcp", "veth", 0.8, true},
		{"rtt", "bridge", 100.0 / 90, true},
		{"rtt", "veth", 2, true},
		{"udp64", "bridge", 0, false},
	} {
		got, ok := r.Summary[c.fig].RatioOfMedians[c.baseline]
		if ok != c.hasRatio || (ok && (got < c.want-1e-9 || got > c.want+1e-9)) {
			t.Errorf("%s onehop/%s = %v (present %v), want %v (present %v)", c.fig, c.baseline, got, ok, c.want, c.hasRatio)
		}
	}
	for fig, want := range map[string]bool{"tcp": true, "rtt": false, "udp64": false} {
		if got := r.Summary[fig].Target.Met; got != want {
			t.Errorf("%s target met = %v, want %v (%s)", fig, got, want, r.Summary[fig].Target.Want)
		}
	}
	if w := r.Summary["rtt"].Target.Want; w != "onehop/bridge <= 1.05" {
		t.Errorf("rtt target = %q", w)
	}
	// A missing ratio must not break the JSON (encoding/json rejects NaN).
	if _, err := json.Marshal(r); err != nil {
		t.Fatal(err)
	}
}

func TestRenderTable(t *testing.T) {
	got := renderTable([][]string{{"figure", "variant", "median"}, {"RTT (µs)", "onehop", "93.0"}, {"", "veth", "5.5"}},
		[]bool{false, false, true})
	want := strings.Join([]string{
		"figure    variant  median",
		"RTT (µs)  onehop     93.0",
		"          veth        5.5",
	}, "\n") + "\n"
	if got != want {
		t.Errorf("renderTable:\n%s\nwant:\n%s", got, want)
	}
}
