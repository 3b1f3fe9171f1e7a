package main

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
)

// summarize turns samples into the comparisons' ratios of medians and
// target verdicts; for RTT a ratio below the target passes, and a strict
// target is not met by equality.
func TestReportSummarize(t *testing.T) {
	names := []string{"onehop", "routed", "routed-2", "router", "router-2", "bridge", "veth"}
	comps, err := Comparisons(scenarios, names)
	if err != nil {
		t.Fatal(err)
	}
	r := &Report{comparisons: comps}
	for _, v := range names {
		r.Variants = append(r.Variants, VariantInfo{Name: v})
	}
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
	add("udp64", "routed", 94e3)             // 94/95: above 0.97
	add("rtt", "routed", 100)                // 100/100: within 1/0.97
	add("tcp", "routed", 19e9)               // 19/20: below 0.97
	add("rtt", "router", 100)                // equal: the strict "<" target misses
	add("udp64", "routed-2", 240e3)
	add("udp64", "router-2", 200e3) // 1.2x: meets ">= 1.2"
	add("cpu", "onehop", 0.9, 1.1, 1.0)
	add("cpu", "bridge", 0.8, 0.8, 0.8)
	r.summarize()

	type want struct {
		ratio    float64 // 0: absent
		op       string
		met      *bool
		informal bool
	}
	yes, no := true, false
	for _, c := range []struct {
		subject, baseline, fig string
		want                   want
	}{
		{"onehop", "bridge", "tcp", want{1.0, ">=", &yes, false}},
		{"onehop", "veth", "tcp", want{0.8, "", nil, true}},
		{"onehop", "bridge", "rtt", want{100.0 / 90, "<=", &no, false}},
		{"onehop", "veth", "rtt", want{2, "", nil, true}},
		{"onehop", "bridge", "udp64", want{0, ">=", &no, false}},
		{"routed", "onehop", "udp64", want{94.0 / 95, ">=", &yes, false}},
		{"routed", "onehop", "rtt", want{1, "<=", &yes, false}},
		{"routed", "onehop", "tcp", want{0.95, ">=", &no, false}},
		{"routed", "router", "rtt", want{1, "<", &no, false}},
		{"routed-2", "router-2", "udp64", want{1.2, ">=", &yes, false}},
		{"onehop", "bridge", "cpu", want{1.25, "", nil, true}},
		{"routed", "onehop", "cpu", want{0, "", nil, true}},
	} {
		var got *ComparisonResult
		for i := range r.Comparisons {
			x := &r.Comparisons[i]
			if x.Subject == c.subject && x.Baseline == c.baseline && x.Figure == c.fig {
				got = x
			}
		}
		name := c.subject + "/" + c.baseline + " " + c.fig
		if got == nil {
			t.Errorf("%s: no comparison", name)
			continue
		}
		if (got.Ratio == nil) != (c.want.ratio == 0) || (got.Ratio != nil && math.Abs(*got.Ratio-c.want.ratio) > 1e-9) {
			t.Errorf("%s: ratio %v, want %v", name, got.Ratio, c.want.ratio)
		}
		if got.Op != c.want.op || (got.Met == nil) != c.want.informal || (got.Met != nil && c.want.met != nil && *got.Met != *c.want.met) {
			t.Errorf("%s: op %q met %v, want %q %v", name, got.Op, got.Met, c.want.op, c.want.met)
		}
	}
	// A missing ratio must not break the JSON (encoding/json rejects NaN).
	if _, err := json.Marshal(r); err != nil {
		t.Fatal(err)
	}
}

func TestCombineSumsRatesAndAveragesRTT(t *testing.T) {
	ms := []Measurement{{Value: 100, Extra: map[string]float64{"lost": 1}}, {Value: 300}}
	if got := Combine("udp64", ms); got.Value != 400 || got.Extra["pair1"] != 100 || got.Extra["pair1.lost"] != 1 {
		t.Errorf("udp64 %+v", got)
	}
	if got := Combine("rtt", ms); got.Value != 200 {
		t.Errorf("rtt %+v", got)
	}
	if got := Combine("tcp", ms[:1]); got.Value != 100 {
		t.Errorf("one pair %+v", got)
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
