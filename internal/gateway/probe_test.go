package gateway

import (
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"
)

type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time        { return c.t }
func (c *fakeClock) add(d time.Duration)   { c.t = c.t.Add(d) }
func (c *fakeClock) nonces() func() uint64 { n := uint64(100); return func() uint64 { n++; return n } }

var (
	rlocA = netip.MustParseAddr("192.0.1.2")
	rlocB = netip.MustParseAddr("192.0.2.2")
	dcEID = netip.MustParsePrefix("10.88.0.0/24")
)

func xtrAt(a netip.Addr) netip.AddrPort { return netip.AddrPortFrom(a, 4342) }

// The state machine: a watched locator is probed at once and then every
// interval; a probe still unanswered when the next is due is a miss; the
// third miss in a row takes it down (at 3 intervals), one answer with the
// outstanding nonce brings it up; answers with a stale or wrong nonce, from
// another address, port or path are ignored and counted.
func TestProberMarksDownAfterMissesAndUpAfterOneAnswer(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	p := NewProber(time.Second, 3, clk.now, clk.nonces())
	ka := ProbeKey{Path: 0, RLOC: rlocA}
	p.Watch(ka, dcEID)
	p.Watch(ProbeKey{Path: 1, RLOC: rlocB}, dcEID)

	probes, changes := p.Tick()
	if len(probes) != 2 || len(changes) != 0 || probes[0].Key != ka || probes[0].EID != dcEID || probes[0].Nonce == probes[1].Nonce {
		t.Fatalf("first tick: %+v %+v; want one probe to each, distinct nonces", probes, changes)
	}
	if pr, _ := p.Tick(); len(pr) != 0 {
		t.Fatalf("a second tick at once sent %+v", pr)
	}
	/* B answers every probe; A answers the first only */
	answerB := func(probes []Probe) {
		for _, pr := range probes {
			if pr.Key.RLOC == rlocB {
				if c, ok := p.Answer(1, xtrAt(rlocB), pr.Nonce); ok {
					t.Fatalf("B changed on an ordinary answer: %+v", c)
				}
			}
		}
	}
	answerB(probes)
	clk.add(300 * time.Millisecond)
	if _, ok := p.Answer(0, xtrAt(rlocA), probes[0].Nonce); ok {
		t.Fatal("an answer to an up locator reported a change")
	}
	if st := p.Status(0); len(st) != 1 || !st[0].Up || st[0].RTT != 300*time.Millisecond || st[0].Answered != 1 {
		t.Fatalf("status of path 0: %+v", st)
	}
	/* a replayed answer (the same nonce again) is not a second answer */
	p.Answer(0, xtrAt(rlocA), probes[0].Nonce)

	var down time.Duration
	start := clk.t
	for i := 0; i < 10 && down == 0; i++ {
		clk.add(700 * time.Millisecond)
		clk.add(300 * time.Millisecond)
		probes, changes = p.Tick()
		answerB(probes)
		for _, c := range changes {
			if c.Key != ka || c.Up {
				t.Fatalf("changes %+v: want only A down", changes)
			}
			down = clk.t.Sub(start)
		}
	}
	if down != 4*time.Second || !p.Down(ka) || p.Down(ProbeKey{Path: 1, RLOC: rlocB}) {
		t.Fatalf("A down after %v (want the 4th tick: 3 probes unanswered), down=%v", down, p.Down(ka))
	}
	var nonceA uint64
	for _, pr := range probes {
		if pr.Key == ka {
			nonceA = pr.Nonce
		}
	}
	/* ignored: wrong nonce, wrong port, an address not probed, A's answer
	   arriving on path 1's socket */
	for _, bad := range []struct {
		path int
		src  netip.AddrPort
		n    uint64
	}{{0, xtrAt(rlocA), nonceA + 1000}, {0, netip.AddrPortFrom(rlocA, 9999), nonceA}, {0, xtrAt(netip.MustParseAddr("192.0.1.66")), nonceA}, {1, xtrAt(rlocA), nonceA}} {
		if _, ok := p.Answer(bad.path, bad.src, bad.n); ok || !p.Down(ka) {
			t.Fatalf("answer %+v brought A up", bad)
		}
	}
	c, ok := p.Answer(0, xtrAt(rlocA), nonceA)
	if !ok || c != (ProbeChange{Key: ka, Up: true}) || p.Down(ka) {
		t.Fatalf("the right answer: %+v %v; want A up", c, ok)
	}
	got := p.Counters()
	if got["probe_bad_nonce"] != 2 || got["probe_bad_source"] != 3 || got["probe_missed"] != 3 || got["probe_answered"] != 7 || got["probe_sent"] != 10 {
		t.Fatalf("counters %v", got)
	}
	for _, n := range ProbeCounterNames {
		if _, ok := got[n]; !ok {
			t.Fatalf("counter %s absent", n)
		}
	}
}

// A locator no connection watches any more is forgotten after the idle
// time, and one forgotten while down comes back up (nothing left to probe).
func TestProberForgetsIdleLocatorsUp(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1000, 0)}
	p := NewProber(time.Second, 1, clk.now, clk.nonces())
	k := ProbeKey{Path: 0, RLOC: rlocA}
	p.Watch(k, dcEID)
	p.Tick()
	clk.add(time.Second)
	if _, ch := p.Tick(); len(ch) != 1 || ch[0].Up {
		t.Fatalf("changes %+v, want down after one miss", ch)
	}
	clk.add(2 * time.Minute)
	if _, ch := p.Tick(); len(ch) != 1 || !ch[0].Up || p.Down(k) || len(p.Status(0)) != 0 {
		t.Fatalf("changes %+v, status %+v: want forgotten, up", ch, p.Status(0))
	}
}

// The engine: a locator found down closes the subflow on its path of each
// connection whose subflow there goes to it (status says "rloc probe"),
// the path shows down with that reason, a new plan leaves the locator
// out, and up again gives the subflow back.
func TestRLOCDownClosesItsSubflowsAndUpBringsThemBack(t *testing.T) {
	cfg := validConfig()
	pm, pin := &fakePM{}, &fakePin{}
	live := []SubflowInfo{
		{Local: netip.MustParseAddrPort("10.77.0.1:4000"), Remote: netip.MustParseAddrPort("10.88.0.10:80"), State: 1},
		{Local: netip.MustParseAddrPort("10.77.0.2:4001"), Remote: netip.MustParseAddrPort("10.88.0.10:80"), State: 1},
	}
	var mu sync.Mutex
	clk := &fakeClock{t: time.Unix(1000, 0)}
	pr := NewProber(time.Second, 3, clk.now, clk.nonces())
	e := NewEngine(&cfg, EngineDeps{
		Find: pathOf, Pin: pin, PM: pm, Prober: pr,
		Subflows: func(*net.TCPConn) ([]SubflowInfo, error) {
			mu.Lock()
			defer mu.Unlock()
			return append([]SubflowInfo(nil), live...), nil
		},
	})
	rec := Record{EID: dcEID, Locators: []Locator{loc("192.0.1.2", 1, 1), loc("192.0.2.2", 1, 1), loc("192.0.2.9", Unusable, 1)}}
	c := &conn{dest: netip.MustParseAddrPort("10.88.0.10:80"), mode: ModeMPTCP, rec: rec, token: 7}
	e.register(c)
	/* another data center's connection on path 0 goes to another locator */
	other := &conn{dest: netip.MustParseAddrPort("10.89.0.10:80"), mode: ModeMPTCP, token: 8,
		rec: Record{EID: netip.MustParsePrefix("10.89.0.0/24"), Locators: []Locator{loc("192.0.1.3", 1, 1)}}}
	e.register(other)

	targets := e.ProbeTargets()
	want := map[ProbeKey]bool{{0, rlocA}: true, {1, rlocB}: true, {0, netip.MustParseAddr("192.0.1.3")}: true}
	if len(targets) != 3 {
		t.Fatalf("probe targets %+v, want %v (not the unusable locator)", targets, want)
	}
	for _, tg := range targets {
		if !want[tg.Key] {
			t.Fatalf("probe target %+v not wanted", tg)
		}
		pr.Watch(tg.Key, tg.EID)
	}

	e.SetRLOCUp(0, rlocA, false)
	pm.mu.Lock()
	destroyed := append([]string(nil), pm.destroyed...)
	pm.mu.Unlock()
	/* both conns read the same fake subflows: only c's plan has 192.0.1.2 on path 0 */
	if len(destroyed) != 1 || destroyed[0] != "10.77.0.1:4000" {
		t.Fatalf("rloc down: destroyed %v, want c's subflow from 10.77.0.1 only", destroyed)
	}
	if p := PlanFor(rec, e.isUp, e.findUsable); len(p.Subflows) != 1 || p.Subflows[0].Path != 1 {
		t.Fatalf("plan with 192.0.1.2 down: %+v, want path 1 only", p)
	}
	paths, conns := e.Status()
	if paths[0].Up != true || paths[0].Reason != "" {
		t.Fatalf("path 0 with one of its two probed locators down: %+v, want still up", paths[0])
	}
	if conns[0].Subflows[0].State != "closed: rloc probe" {
		t.Fatalf("subflow status %+v", conns[0].Subflows)
	}
	e.SetRLOCUp(0, netip.MustParseAddr("192.0.1.3"), false)
	pr.Tick()
	for range 3 {
		clk.add(time.Second)
		pr.Tick()
	}
	if paths, _ = e.Status(); paths[0].Up || paths[0].Reason != "rloc probe" || !paths[1].Up || len(paths[0].Probes) != 2 {
		t.Fatalf("paths with every locator of path 0 down: %+v", paths)
	}
	if paths[0].State() != "down: rloc probe" || paths[1].State() != "up" {
		t.Fatalf("states %q %q", paths[0].State(), paths[1].State())
	}
	e.SetPathUp(1, false)
	if paths, _ = e.Status(); paths[1].State() != "down: link down" {
		t.Fatalf("path 1 link down: %q", paths[1].State())
	}
	e.SetPathUp(1, true)

	mu.Lock()
	live[0].State = 7
	mu.Unlock()
	e.SetRLOCUp(0, rlocA, true)
	pm.waitOneCreated(t, "rloc up", "10.77.0.1", func() bool { return true })
	got := e.Counters()
	if got["rloc_down"] != 2 || got["rloc_up"] != 1 || got["subflows_closed_rloc_down"] != 2 || got["probe_sent"] != 12 {
		t.Fatalf("counters %v", got)
	}
	if paths, _ = e.Status(); !paths[0].Up {
		t.Fatalf("path 0 with a locator up again: %+v", paths[0])
	}
}

func TestProbeConfigValidation(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"off", func(c *Config) { c.ProbeInterval = 0 }, ""},
		{"on", func(c *Config) {
			c.ProbeInterval, c.ProbeMisses = time.Second, 3
			c.Paths[0].RLOC, c.Paths[1].RLOC = rlocA, rlocB
		}, ""},
		{"negative", func(c *Config) { c.ProbeInterval = -time.Second }, "--rloc-probe-interval -1s"},
		{"too fast", func(c *Config) { c.ProbeInterval = time.Millisecond }, "at least 100ms"},
		{"no misses", func(c *Config) {
			c.ProbeInterval = time.Second
			c.Paths[0].RLOC, c.Paths[1].RLOC = rlocA, rlocB
		}, "--rloc-probe-misses 0: want 1 to 100"},
		{"no rloc", func(c *Config) { c.ProbeInterval, c.ProbeMisses = time.Second, 3 }, "--path dev=wan1: --rloc-probe-interval needs rloc="},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := validConfig()
			tc.edit(&c)
			err := c.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("want valid, got %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("want an error containing %q, got %v", tc.want, err)
			}
		})
	}
}
