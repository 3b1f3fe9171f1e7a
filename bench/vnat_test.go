package main

import (
	"bufio"
	"io"
	"net"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/testenv"
)

// A scenario that names its tests runs those (and only those) in every
// round; the others run the default ones.
func TestScenariosRunTheirOwnTests(t *testing.T) {
	a := &Scenario{Name: "a"}
	b := &Scenario{Name: "b", Tests: []string{"rr", "crr"}}
	c := &Scenario{Name: "c", Tests: []string{}}
	var got []string
	for _, st := range ScheduleScenarios([]*Scenario{a, b, c}, 2) {
		got = append(got, st.Scenario+"/"+st.Test)
	}
	want := []string{"a/tcp", "a/rtt", "a/udp64", "b/rr", "b/crr", "b/rr", "b/crr", "a/tcp", "a/rtt", "a/udp64"}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("steps %v, want %v", got, want)
	}
}

// Comparisons are made only for figures both sides measure, and a target
// for a figure one side does not measure is an error, not a silent gap.
func TestComparisonsOnlyForFiguresBothSidesMeasure(t *testing.T) {
	base := &Scenario{Name: "base", Tests: []string{"tcp", "rr"}}
	sub := &Scenario{Name: "sub", Tests: []string{"tcp", "rr", "crr"}, Baselines: []Baseline{{Scenario: "base", Targets: map[string]Target{"rr": {Ratio: 0.99}}}}}
	comps, err := Comparisons([]*Scenario{base, sub}, []string{"base", "sub"})
	if err != nil {
		t.Fatal(err)
	}
	var figs []string
	for _, c := range comps {
		figs = append(figs, c.figure)
		if c.figure == "rr" && c.target != 0.99 {
			t.Errorf("rr target %v, want 0.99", c.target)
		}
	}
	if want := []string{"tcp", "cpu", "rr"}; !reflect.DeepEqual(figs, want) {
		t.Errorf("figures compared %v, want %v (crr: the baseline does not measure it)", figs, want)
	}
	sub.Baselines[0].Targets = map[string]Target{"crr": {Ratio: 1}}
	if _, err := Comparisons([]*Scenario{base, sub}, []string{"base", "sub"}); err == nil || !strings.Contains(err.Error(), `"crr"`) {
		t.Errorf("a target on a figure the baseline does not measure: err %v", err)
	}
	// The registered VNAT scenarios compare all five tests' figures.
	comps, err = Comparisons(scenarios, []string{"vnat-base", "vnat1", "vnat2"})
	if err != nil {
		t.Fatal(err)
	}
	n := map[string]int{}
	for _, c := range comps {
		n[c.subject+"/"+c.baseline]++
	}
	if want := map[string]int{"vnat1/vnat-base": 6, "vnat2/vnat-base": 6, "vnat2/vnat1": 6}; !reflect.DeepEqual(n, want) {
		t.Errorf("vnat comparisons %v, want %v", n, want)
	}
}

func TestParseRR(t *testing.T) {
	m, err := ParseRR([]byte(`{"mode":"rr","count":30000,"seconds":3,"errors":0}` + "\n"))
	if err != nil || m.Value != 10000 || m.Extra["count"] != 30000 {
		t.Fatalf("ParseRR = %+v, %v; want 10000/s", m, err)
	}
	for _, bad := range []string{
		`{"mode":"crr","count":5,"seconds":3,"errors":1,"err":"connect: cannot assign requested address"}`,
		`{"mode":"rr","count":0,"seconds":3,"errors":0}`,
		``,
	} {
		if _, err := ParseRR([]byte(bad)); err == nil {
			t.Errorf("ParseRR(%q) took it", bad)
		}
	}
}

// rrperf's modes against its own server on loopback: rr and crr count
// transactions, hold keeps its connections and echoes on each.
func TestRRPerfOnLoopback(t *testing.T) {
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	go rrServe(addr, -1, false) //nolint:errcheck // ends with the test binary
	testenv.Eventually(t, "the server to listen on "+addr, 5*time.Second, func() error {
		c, err := net.Dial("tcp4", addr)
		if err == nil {
			c.Close()
		}
		return err
	})
	for _, mode := range []string{"rr", "crr"} {
		r := rrClient(mode, addr, 200*time.Millisecond)
		if r.Errors != 0 || r.Count == 0 {
			t.Errorf("%s: %+v", mode, r)
		}
	}
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- rrHold(addr, 20, -1, inR, outW); outW.Close() }()
	sc := bufio.NewScanner(outR)
	for _, step := range []struct{ send, want string }{{"", "ready 20"}, {"check", "ok 20"}, {"check", "ok 20"}} {
		if step.send != "" {
			if _, err := io.WriteString(inW, step.send+"\n"); err != nil {
				t.Fatal(err)
			}
		}
		if !sc.Scan() || sc.Text() != step.want {
			t.Fatalf("hold after %q: %q, want %q", step.send, sc.Text(), step.want)
		}
	}
	io.WriteString(inW, "quit\n") //nolint:errcheck // checked by done
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
