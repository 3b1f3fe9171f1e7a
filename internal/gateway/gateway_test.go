package gateway

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/lisp"
	"github.com/onehop/onehop/internal/testenv"
)

func validConfig() Config {
	return Config{
		Intercept: []string{"eth0"},
		EIDPrefix: netip.MustParsePrefix("10.77.0.0/24"),
		Paths: []Path{
			{Name: "wan1", Dev: "wan1", EID: netip.MustParseAddr("10.77.0.1")},
			{Name: "wan2", Dev: "wan2", EID: netip.MustParseAddr("10.77.0.2")},
		},
		ListenPort: DefaultListenPort, FWMark: DefaultFWMark, Table: DefaultTable,
		RulePriority: DefaultRulePriority, Congestion: DefaultCongestion, MaxPerClient: DefaultMaxPerClient,
		Static: []Record{{EID: netip.MustParsePrefix("10.88.0.0/24")}},
	}
}

func TestConfigValidateNamesTheFlagAtFault(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string // "" = valid
	}{
		{"valid", func(*Config) {}, ""},
		{"no intercept", func(c *Config) { c.Intercept = nil }, "--intercept"},
		{"no eid prefix", func(c *Config) { c.EIDPrefix = netip.Prefix{} }, "--eid-prefix: required"},
		{"ipv6 prefix", func(c *Config) { c.EIDPrefix = netip.MustParsePrefix("fd00::/64") }, "--eid-prefix fd00::/64: only IPv4"},
		{"no paths", func(c *Config) { c.Paths = nil }, "--path: give at least one"},
		{"nine paths", func(c *Config) {
			c.Paths = nil
			for i := range 9 {
				c.Paths = append(c.Paths, Path{Name: string(rune('a' + i)), Dev: string(rune('a' + i)), EID: netip.AddrFrom4([4]byte{10, 77, 0, byte(i + 1)})})
			}
		}, "--path: 9 paths, at most 8"},
		{"eid outside prefix", func(c *Config) { c.Paths[1].EID = netip.MustParseAddr("10.78.0.2") }, "--path eid=10.78.0.2: not inside --eid-prefix"},
		{"same eid", func(c *Config) { c.Paths[1].EID = c.Paths[0].EID }, "--path eid=10.77.0.1: used by two paths"},
		{"same dev", func(c *Config) { c.Paths[1].Dev = "wan1" }, "--path dev=wan1: named twice"},
		{"intercept a path", func(c *Config) { c.Intercept = []string{"wan2"} }, "--intercept wan2: is also a --path dev"},
		{"port 0", func(c *Config) { c.ListenPort = 0 }, "--listen-port"},
		{"no mapping system", func(c *Config) { c.Static = nil }, "--map-resolver or --map"},
		{"mark 0", func(c *Config) { c.FWMark = 0 }, "--fwmark"},
		{"table in reserved range", func(c *Config) { c.Table = 252 }, "--table 252"},
		{"no congestion", func(c *Config) { c.Congestion = "" }, "--congestion"},
		{"whole superpackets without lisp", func(c *Config) { c.WholeSuperpackets = true }, "--whole-superpackets: only with --lisp"},
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

func TestParsePathAndMap(t *testing.T) {
	p, err := ParsePath("dev=wan1,eid=10.77.0.1,rloc=192.0.2.1")
	if err != nil || p.Name != "wan1" || p.EID != netip.MustParseAddr("10.77.0.1") || p.RLOC != netip.MustParseAddr("192.0.2.1") {
		t.Fatalf("ParsePath: %+v, %v", p, err)
	}
	for _, bad := range []struct{ in, want string }{
		{"eid=10.77.0.1", "no dev="},
		{"dev=x", "no eid="},
		{"dev=x,eid=nope", "eid:"},
		{"dev=x,eid=10.0.0.1,color=red", `unknown key "color"`},
		{"dev", "is not KEY=VALUE"},
	} {
		if _, err := ParsePath(bad.in); err == nil || !strings.Contains(err.Error(), bad.want) || !strings.Contains(err.Error(), "--path") {
			t.Errorf("ParsePath(%q): want an error naming --path and %q, got %v", bad.in, bad.want, err)
		}
	}
	r, err := ParseMap("10.88.0.7/24=192.0.2.2,198.51.100.2/255,203.0.113.2/2/50")
	if err != nil {
		t.Fatal(err)
	}
	want := []Locator{
		{Addr: netip.MustParseAddr("192.0.2.2"), Priority: 1, Weight: 100},
		{Addr: netip.MustParseAddr("198.51.100.2"), Priority: 255, Weight: 100},
		{Addr: netip.MustParseAddr("203.0.113.2"), Priority: 2, Weight: 50},
	}
	if r.EID != netip.MustParsePrefix("10.88.0.0/24") || len(r.Locators) != 3 || r.Locators[0] != want[0] || r.Locators[1] != want[1] || r.Locators[2] != want[2] {
		t.Fatalf("ParseMap: %+v", r)
	}
	if r, err := ParseMap("10.99.0.0/16=negative"); err != nil || !r.Negative {
		t.Fatalf("negative: %+v, %v", r, err)
	}
	for _, bad := range []string{"10.88.0.0/24", "nope=1.2.3.4", "10.0.0.0/8=1.2.3.4/300", "10.0.0.0/8=1.2.3.4/1/x", "10.0.0.0/8=x"} {
		if _, err := ParseMap(bad); err == nil || !strings.Contains(err.Error(), "--map") {
			t.Errorf("ParseMap(%q): want an error naming --map, got %v", bad, err)
		}
	}
}

// pathOf matches the test's RLOCs to paths by their third octet: 192.0.1.x
// is path 0, 192.0.2.x path 1, and so on; 203.x reaches no path.
func pathOf(rloc netip.Addr) (int, bool) {
	b := rloc.As4()
	if b[0] != 192 {
		return 0, false
	}
	return int(b[2]) - 1, true
}

func loc(a string, prio, weight uint8) Locator {
	return Locator{Addr: netip.MustParseAddr(a), Priority: prio, Weight: weight}
}

func TestPlanForOpensOneSubflowPerUsableLocator(t *testing.T) {
	allUp := func(int) bool { return true }
	for _, tc := range []struct {
		name     string
		rec      Record
		up       func(int) bool
		mode     Mode
		subflows []int // paths, initial first
		why      string
	}{
		{"negative reply goes native", Record{Negative: true}, allUp, ModeNative, nil, "negative"},
		{"two locators, two paths", Record{Locators: []Locator{loc("192.0.1.2", 1, 50), loc("192.0.2.2", 1, 50)}}, allUp, ModeMPTCP, []int{0, 1}, ""},
		{"priority 255 is unusable", Record{Locators: []Locator{loc("192.0.1.2", 255, 50), loc("192.0.2.2", 1, 50)}}, allUp, ModeMPTCP, []int{1}, ""},
		{"all unusable goes native", Record{Locators: []Locator{loc("192.0.1.2", 255, 50), loc("192.0.2.2", 255, 50)}}, allUp, ModeNative, nil, "no usable locator (2 with priority 255)"},
		{"best priority is the initial subflow", Record{Locators: []Locator{loc("192.0.1.2", 2, 50), loc("192.0.2.2", 1, 50)}}, allUp, ModeMPTCP, []int{1, 0}, ""},
		{"heavier first within a priority", Record{Locators: []Locator{loc("192.0.1.2", 1, 10), loc("192.0.2.2", 1, 90)}}, allUp, ModeMPTCP, []int{1, 0}, ""},
		{"one subflow per path", Record{Locators: []Locator{loc("192.0.1.2", 1, 50), loc("192.0.1.3", 1, 50)}}, allUp, ModeMPTCP, []int{0}, ""},
		{"a locator no path reaches is left out", Record{Locators: []Locator{loc("203.0.113.1", 1, 50), loc("192.0.2.2", 1, 50)}}, allUp, ModeMPTCP, []int{1}, ""},
		{"a path that is down is left out", Record{Locators: []Locator{loc("192.0.1.2", 1, 50), loc("192.0.2.2", 1, 50)}}, func(p int) bool { return p != 0 }, ModeMPTCP, []int{1}, ""},
		{"no path up goes native", Record{Locators: []Locator{loc("192.0.1.2", 1, 50)}}, func(int) bool { return false }, ModeNative, nil, "no locator reachable"},
		{"at most eight", Record{Locators: func() []Locator {
			var ls []Locator
			for i := range 10 {
				ls = append(ls, Locator{Addr: netip.AddrFrom4([4]byte{192, 0, byte(i + 1), 2}), Priority: 1, Weight: 1})
			}
			return ls
		}()}, allUp, ModeMPTCP, []int{0, 1, 2, 3, 4, 5, 6, 7}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := PlanFor(tc.rec, tc.up, pathOf)
			if p.Mode != tc.mode || !strings.Contains(p.Why, tc.why) {
				t.Fatalf("mode %s (%q), want %s (%q)", p.Mode, p.Why, tc.mode, tc.why)
			}
			var got []int
			for _, s := range p.Subflows {
				got = append(got, s.Path)
			}
			if len(got) != len(tc.subflows) {
				t.Fatalf("subflows on paths %v, want %v", got, tc.subflows)
			}
			for i := range got {
				if got[i] != tc.subflows[i] {
					t.Fatalf("subflows on paths %v, want %v", got, tc.subflows)
				}
			}
		})
	}
}

func TestStaticResolverLongestPrefixAndChain(t *testing.T) {
	s := StaticResolver{
		{EID: netip.MustParsePrefix("10.88.0.0/16"), Locators: []Locator{loc("192.0.1.2", 1, 1)}},
		{EID: netip.MustParsePrefix("10.88.1.0/24"), Locators: []Locator{loc("192.0.2.2", 1, 1)}},
	}
	r, err := s.Resolve(context.Background(), netip.MustParseAddr("10.88.1.9"))
	if err != nil || r.EID.Bits() != 24 {
		t.Fatalf("longest prefix: %+v, %v", r, err)
	}
	r, err = s.Resolve(context.Background(), netip.MustParseAddr("10.99.0.1"))
	if err != nil || !r.Negative {
		t.Fatalf("uncovered: want negative, got %+v, %v", r, err)
	}
	failing := resolverFunc(func(context.Context, netip.Addr) (Record, error) { return Record{}, errors.New("no reply") })
	r, err = Chain{s, failing}.Resolve(context.Background(), netip.MustParseAddr("10.88.0.1"))
	if err != nil || r.Negative {
		t.Fatalf("chain, static answers: %+v, %v", r, err)
	}
	if _, err = (Chain{failing}).Resolve(context.Background(), netip.MustParseAddr("10.88.0.1")); err == nil {
		t.Fatal("chain of one failing resolver: want its error")
	}
	r, err = Chain{s, failing}.Resolve(context.Background(), netip.MustParseAddr("10.99.0.1"))
	if err != nil || !r.Negative {
		t.Fatalf("chain, static negative then failure: want the negative, got %+v, %v", r, err)
	}
}

type resolverFunc func(context.Context, netip.Addr) (Record, error)

func (f resolverFunc) Resolve(ctx context.Context, a netip.Addr) (Record, error) { return f(ctx, a) }

func TestNFTRulesInterceptOnlyTheUserSide(t *testing.T) {
	c := validConfig()
	c.Intercept = []string{"eth0", "eth1"}
	got := NFTRules(&c)
	for _, want := range []string{
		"table ip onehop_gateway\ndelete table ip onehop_gateway\n",
		`iifname { "eth0", "eth1" } meta l4proto tcp fib daddr type != local tproxy to 127.0.0.1:15001 meta mark set 0x4f48 accept`,
		"type filter hook prerouting priority mangle; policy accept;",
	} {
		if !strings.Contains(got, want) {
			t.Fatalf("rules lack %q:\n%s", want, got)
		}
	}
	if NFTDelete() != "delete table ip onehop_gateway\n" {
		t.Fatal(NFTDelete())
	}
}

// What users are never forwarded to: the flags' prefixes and the
// map-server's and map-resolver's addresses, each once, none inside
// another (nftables refuses overlapping intervals), dropped before the
// TPROXY rule in every protocol and counted.
func TestNFTRulesDropUsersToInfrastructureFirst(t *testing.T) {
	c := validConfig()
	c.MapServer = netip.MustParseAddrPort("192.168.100.1:4342")   // inside the fabric below
	c.MapResolver = netip.MustParseAddrPort("198.51.100.53:4342") // outside it
	for _, s := range []string{"192.168.100.0/24", "203.0.113.7", "192.168.100.10"} {
		p, err := ParseInfrastructure(s)
		if err != nil {
			t.Fatal(err)
		}
		c.Infrastructure = append(c.Infrastructure, p)
	}
	got := NFTRules(&c)
	drop := `iifname { "eth0" } ip daddr { 192.168.100.0/24, 198.51.100.53/32, 203.0.113.7/32 } counter name "infrastructure" drop`
	tproxy := `meta l4proto tcp fib daddr type != local tproxy`
	if i, j := strings.Index(got, drop), strings.Index(got, tproxy); i < 0 || j < 0 || i > j {
		t.Fatalf("rules lack the drop before the TPROXY rule:\n%s", got)
	}
	if !strings.Contains(got, "counter infrastructure {") {
		t.Fatalf("rules lack the named counter:\n%s", got)
	}
	// Nothing to protect: no rule, the counter still there (status reads it).
	bare := validConfig()
	if got := NFTRules(&bare); strings.Contains(got, "drop") || !strings.Contains(got, "counter infrastructure {") {
		t.Fatalf("no infrastructure:\n%s", got)
	}
	if _, err := ParseInfrastructure("controller"); err == nil || !strings.Contains(err.Error(), "--infrastructure") {
		t.Fatalf("a name: %v", err)
	}
	c.Infrastructure = append(c.Infrastructure, netip.MustParsePrefix("2001:db8::/32"))
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "--infrastructure 2001:db8::/32: only IPv4") {
		t.Fatalf("IPv6: %v", err)
	}
	n, err := ParseNFTCounter([]byte(`{"nftables": [{"metainfo": {"version": "1.0.6"}}, {"counter": {"family": "ip", "name": "infrastructure", "table": "onehop_gateway", "handle": 1, "packets": 42, "bytes": 2520}}]}`), NFTInfraCounter)
	if err != nil || n != 42 {
		t.Fatalf("counter: %d, %v", n, err)
	}
	if _, err := ParseNFTCounter([]byte(`{"nftables": []}`), NFTInfraCounter); err == nil {
		t.Fatal("a missing counter read as 0")
	}
}

// A fake map-resolver on loopback answers with internal/lisp's codecs; the
// gateway's LISPResolver turns the reply into its record.
func TestLISPResolverAsksAMapResolver(t *testing.T) {
	held := []lisp.Record{{
		EID: netip.MustParsePrefix("10.88.0.0/24"), TTL: 10 * time.Minute,
		Locators: []lisp.Locator{
			{Addr: netip.MustParseAddr("192.0.1.2"), Priority: 1, Weight: 50},
			{Addr: netip.MustParseAddr("192.0.2.2"), Priority: 255, Weight: 50},
		},
	}}
	server := fakeMapResolver(t, "127.0.0.1:0", held)
	r := NewLISPResolver(server)
	rec, err := r.Resolve(context.Background(), netip.MustParseAddr("10.88.0.10"))
	if err != nil {
		t.Fatal(err)
	}
	if rec.Negative || rec.EID != held[0].EID || len(rec.Locators) != 2 || rec.Locators[1].Priority != Unusable {
		t.Fatalf("record %+v", rec)
	}
	if p := PlanFor(rec, nil, pathOf); p.Mode != ModeMPTCP || len(p.Subflows) != 1 || p.Subflows[0].Path != 0 {
		t.Fatalf("plan %+v: want one subflow on path 0 (the other locator is unusable)", p)
	}
	rec, err = r.Resolve(context.Background(), netip.MustParseAddr("10.99.0.1"))
	if err != nil || !rec.Negative {
		t.Fatalf("unmapped: want negative, got %+v, %v", rec, err)
	}
}

// fakeMapResolver answers Map-Requests on addr from held until the test ends.
func fakeMapResolver(t *testing.T, addr string, held []lisp.Record) netip.AddrPort {
	t.Helper()
	pc, err := net.ListenPacket("udp4", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			req, err := lisp.DecodeMapRequest(buf[:n])
			if err != nil || len(req.EIDs) == 0 {
				continue
			}
			rep := lisp.MapReply{Nonce: req.Nonce, Records: []lisp.Record{lisp.Answer(held, req.EIDs[0].Addr())}}
			b, err := rep.Encode()
			if err != nil {
				continue
			}
			pc.WriteTo(b, from) //nolint:errcheck // the asker retries
		}
	}()
	return pc.LocalAddr().(*net.UDPAddr).AddrPort()
}

// fakes for the engine's path handling
type fakePM struct {
	mu        sync.Mutex
	created   []string
	destroyed []string
}

func (f *fakePM) Create(token uint32, id uint8, local netip.Addr, remote netip.AddrPort) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.created = append(f.created, local.String())
	return nil
}

func (f *fakePM) Destroy(token uint32, local, remote netip.AddrPort) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.destroyed = append(f.destroyed, local.String())
	return nil
}

// waitOneCreated waits until f created one subflow, from eid, and done
// holds; it fails at once when f created more (when, a step of the test).
func (f *fakePM) waitOneCreated(t *testing.T, when, eid string, done func() bool) {
	t.Helper()
	testenv.Eventually(t, when+": one subflow from "+eid, 5*time.Second, func() error {
		f.mu.Lock()
		created := append([]string(nil), f.created...)
		f.mu.Unlock()
		if len(created) > 1 {
			t.Fatalf("%s: created %v, want one subflow from %s", when, created, eid)
		}
		if len(created) == 1 && created[0] == eid && done() {
			return nil
		}
		return fmt.Errorf("created %v", created)
	})
}

// liveSubflows is a SubflowReader over subflows the test changes.
type liveSubflows struct {
	mu  sync.Mutex
	sfs []SubflowInfo
}

func (l *liveSubflows) read(*net.TCPConn) ([]SubflowInfo, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]SubflowInfo(nil), l.sfs...), nil
}

func (l *liveSubflows) set(change func([]SubflowInfo)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	change(l.sfs)
}

type fakePin struct{ repinned []int }

func (f *fakePin) Pin(int, Record, netip.Addr) error { return nil }
func (f *fakePin) Repin(p int) error                 { f.repinned = append(f.repinned, p); return nil }
func (f *fakePin) Close() error                      { return nil }

// A path going down closes the subflows on it (and only those) and status
// keeps them as closed; coming back re-pins it and adds the subflow to
// every MPTCP connection whose record has a usable locator on it.
func TestPathDownClosesItsSubflowsAndUpBringsThemBack(t *testing.T) {
	cfg := validConfig()
	pm, pin := &fakePM{}, &fakePin{}
	live := []SubflowInfo{
		{Local: netip.MustParseAddrPort("10.77.0.1:4000"), Remote: netip.MustParseAddrPort("10.88.0.10:80"), BytesReceived: 100, State: 1},
		{Local: netip.MustParseAddrPort("10.77.0.2:4001"), Remote: netip.MustParseAddrPort("10.88.0.10:80"), BytesReceived: 200, State: 1},
	}
	ls := &liveSubflows{sfs: live}
	e := NewEngine(&cfg, EngineDeps{Find: pathOf, Pin: pin, PM: pm, Subflows: ls.read})
	rec := Record{EID: netip.MustParsePrefix("10.88.0.0/24"), Locators: []Locator{loc("192.0.1.2", 1, 1), loc("192.0.2.2", 1, 1)}}
	c := &conn{dest: netip.MustParseAddrPort("10.88.0.10:80"), mode: ModeMPTCP, rec: rec, token: 7}
	e.register(c)
	native := &conn{dest: netip.MustParseAddrPort("10.99.0.1:80"), mode: ModeNative}
	e.register(native)

	e.SetPathUp(0, false)
	if len(pm.destroyed) != 1 || pm.destroyed[0] != "10.77.0.1:4000" {
		t.Fatalf("path 0 down: destroyed %v, want the subflow from 10.77.0.1 only", pm.destroyed)
	}
	ls.set(func(sfs []SubflowInfo) { sfs[0].State = 7 /* the kernel keeps it a while, closed */ })
	_, conns := e.Status()
	if len(conns) != 2 || len(conns[0].Subflows) != 2 || conns[0].Subflows[0].State != "closed: path down" || conns[0].Subflows[0].BytesReceived != 100 {
		t.Fatalf("status after path down: %+v", conns)
	}
	e.SetPathUp(0, false) /* no change: nothing more */
	if len(pm.destroyed) != 1 {
		t.Fatalf("repeated down: destroyed %v", pm.destroyed)
	}

	e.SetPathUp(0, true)
	if len(pin.repinned) != 1 || pin.repinned[0] != 0 {
		t.Fatalf("path 0 up: repinned %v, want [0]", pin.repinned)
	}
	pm.waitOneCreated(t, "path 0 up", "10.77.0.1", func() bool { return e.Counters()["subflows_created"] == 1 })
	if got := e.Counters(); got["path_down"] != 1 || got["path_up"] != 1 || got["subflows_closed_path_down"] != 1 || got["subflows_created"] != 1 {
		t.Fatalf("counters %v", got)
	}
}

// With --map-server the gateway registers each path's EID behind that
// path's RLOC; the Map-Register authenticates with the key, and a map-server
// with another key refuses it.
func TestRegistrarRegistersEachPathsEIDBehindItsRLOC(t *testing.T) {
	cfg := validConfig()
	cfg.LISP = true
	cfg.Paths[0].RLOC = netip.MustParseAddr("192.0.1.1")
	cfg.Paths[1].RLOC = netip.MustParseAddr("192.0.2.1")
	cfg.MapServerKey, cfg.KeyID = "s3cret", 3
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	cfg.MapServer = pc.LocalAddr().(*net.UDPAddr).AddrPort()
	got := make(chan lisp.MapRegister, 1)
	authErr := make(chan error, 2)
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if err := lisp.Authenticate(buf[:n], []byte("s3cret")); err != nil {
				authErr <- err
				continue
			}
			reg, err := lisp.DecodeMapRegister(buf[:n])
			if err != nil {
				authErr <- err
				continue
			}
			got <- reg
			notify := lisp.MapNotify{Nonce: reg.Nonce, Records: reg.Records}
			b, err := notify.Seal(reg.KeyID, []byte("s3cret"))
			if err != nil {
				authErr <- err
				continue
			}
			pc.WriteTo(b, from) //nolint:errcheck // the registrar times out and says so
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := registrar(&cfg, nil).Register(ctx); err != nil {
		t.Fatalf("register: %v", err)
	}
	reg := <-got
	if reg.KeyID != 3 || len(reg.Records) != 2 {
		t.Fatalf("map-register %+v", reg)
	}
	for i, r := range reg.Records {
		p := cfg.Paths[i]
		if r.EID != netip.PrefixFrom(p.EID, 32) || len(r.Locators) != 1 || r.Locators[0].Addr != p.RLOC || r.Locators[0].Priority != 1 {
			t.Fatalf("record %d: %+v, want %s/32 behind %s", i, r, p.EID, p.RLOC)
		}
	}
	cfg.MapServerKey = "wrong"
	short, cancel2 := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel2()
	r := registrar(&cfg, nil)
	r.Attempts, r.Timeout = 1, 200*time.Millisecond
	if err := r.Register(short); err == nil {
		t.Fatal("a register with the wrong key got a Map-Notify")
	}
	if err := <-authErr; !errors.Is(err, lisp.ErrBadAuth) {
		t.Fatalf("map-server's check of the wrong key: %v, want ErrBadAuth", err)
	}
}

// One user address gets at most --max-per-client connections at once; a
// slot given back is usable again, and other users are not affected.
func TestAdmitBoundsEachUsersConnections(t *testing.T) {
	cfg := validConfig()
	cfg.MaxPerClient = 2
	e := NewEngine(&cfg, EngineDeps{})
	a, b := netip.MustParseAddr("10.66.0.2"), netip.MustParseAddr("10.66.0.3")
	for i := range 2 {
		if !e.admit(a) {
			t.Fatalf("connection %d of 2 refused", i+1)
		}
	}
	if e.admit(a) {
		t.Fatal("third admitted")
	}
	if !e.admit(b) {
		t.Fatal("another user refused")
	}
	e.release(a)
	if !e.admit(a) {
		t.Fatal("a released slot not usable")
	}
	if got := e.Counters()["refused_per_client"]; got != 1 {
		t.Fatalf("refused_per_client = %d, want 1", got)
	}
}
