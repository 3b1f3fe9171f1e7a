package xtr

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/onehop/onehop/internal/lisp"
)

func TestParseRLOCNamesWhatIsWrong(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"wan1", ""},
		{"wan1,addr=172.31.1.130,priority=2,weight=10", ""},
		{"", "the interface first"},
		{"addr=1.2.3.4", "the interface first"},
		{"wan1,addr=::1", "not an IPv4 address"},
		{"wan1,priority=256", "want 0-255"},
		{"wan1,colour=red", `unknown key "colour"`},
		{"wan1,weight", "is not KEY=VALUE"},
	} {
		r, err := ParseRLOC(tc.in)
		if tc.want == "" {
			if err != nil || r.Dev != "wan1" {
				t.Errorf("ParseRLOC(%q) = %+v, %v", tc.in, r, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "--rloc") {
			t.Errorf("ParseRLOC(%q) error %v; want one naming --rloc and %q", tc.in, err, tc.want)
		}
	}
	r, _ := ParseRLOC("wan2,priority=3,weight=7")
	if r.Priority != 3 || r.Weight != 7 {
		t.Errorf("priority/weight not read: %+v", r)
	}
	if r, _ := ParseRLOC("wan2"); r.Priority != DefaultPriority || r.Weight != DefaultWeight {
		t.Errorf("defaults not applied: %+v", r)
	}
}

func validConfig() Config {
	return Config{
		RLOCs:       []RLOC{{Dev: "wan1", Priority: 1, Weight: 50}, {Dev: "wan2", Priority: 1, Weight: 50}},
		EIDDevs:     []string{"s-srv"},
		EIDPrefixes: []netip.Prefix{netip.MustParsePrefix("10.88.0.0/24")},
		MapServer:   netip.MustParseAddrPort("192.168.100.1:4342"),
		Key:         []byte("secret-key"), KeyID: 2, TTL: 10 * time.Minute, RegisterInterval: time.Minute,
	}
}

func TestConfigValidateNamesTheFlag(t *testing.T) {
	ok := validConfig()
	if err := ok.Validate(); err != nil {
		t.Fatalf("valid config refused: %v", err)
	}
	for _, tc := range []struct {
		name string
		mod  func(*Config)
		want string
	}{
		{"no rloc", func(c *Config) { c.RLOCs = nil }, "--rloc"},
		{"dev twice", func(c *Config) { c.RLOCs[1].Dev = "wan1" }, "--rloc wan1: interface given twice"},
		{"eid dev is an rloc", func(c *Config) { c.EIDDevs = []string{"wan2"} }, "--eid-dev wan2"},
		{"no eid dev", func(c *Config) { c.EIDDevs = nil }, "--eid-dev"},
		{"no prefix", func(c *Config) { c.EIDPrefixes = nil }, "--eid-prefix"},
		{"overlap", func(c *Config) {
			c.EIDPrefixes = append(c.EIDPrefixes, netip.MustParsePrefix("10.88.0.128/25"))
		}, "overlaps"},
		{"no map server", func(c *Config) { c.MapServer = netip.AddrPort{} }, "--map-server"},
		{"short key", func(c *Config) { c.Key = []byte("abc") }, "--key-file"},
		{"ttl seconds", func(c *Config) { c.TTL = 90 * time.Second }, "--ttl"},
		{"interval >= ttl", func(c *Config) { c.RegisterInterval = 10 * time.Minute }, "--register-interval"},
	} {
		c := validConfig()
		c.RLOCs = append([]RLOC(nil), c.RLOCs...)
		tc.mod(&c)
		err := c.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v; want it to mention %q", tc.name, err, tc.want)
		}
	}
}

func TestRecordsPutTheSiteBehindEveryRLOC(t *testing.T) {
	c := validConfig()
	c.RLOCs[1].Priority = 255
	a1, a2 := netip.MustParseAddr("172.31.1.130"), netip.MustParseAddr("172.31.2.130")
	recs := c.Records([]netip.Addr{a1, a2})
	if len(recs) != 1 || recs[0].EID != c.EIDPrefixes[0] || recs[0].TTL != c.TTL || len(recs[0].Locators) != 2 {
		t.Fatalf("records %+v", recs)
	}
	l := recs[0].Locators
	if l[0].Addr != a1 || l[1].Addr != a2 || l[0].Priority != 1 || l[1].Priority != 255 || !l[0].Local || !l[0].Reachable {
		t.Fatalf("locators %+v", l)
	}
	if err := recs[0].Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestPlanUsesEveryUsableLocatorAnRLOCReaches(t *testing.T) {
	g1, g2, g3, g4 := netip.MustParseAddr("172.31.1.2"), netip.MustParseAddr("172.31.2.2"), netip.MustParseAddr("172.31.3.2"), netip.MustParseAddr("203.0.113.9")
	rec := lisp.Record{EID: netip.MustParsePrefix("10.77.0.1/32"), TTL: time.Minute, Locators: []lisp.Locator{
		{Addr: g2, Priority: 2, Weight: 10}, {Addr: g1, Priority: 1, Weight: 100}, {Addr: g3, Priority: 255}, {Addr: g4, Priority: 1},
	}}
	find := func(a netip.Addr) (int, bool) {
		switch a {
		case g1:
			return 0, true
		case g2, g3:
			return 1, true
		}
		return 0, false
	}
	got := Plan(rec, find)
	want := []Choice{{Tunnel{0, g1}, 1, 100}, {Tunnel{1, g2}, 2, 10}}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("Plan = %+v; want %+v (unusable and unreachable locators left out)", got, want)
	}
	if Plan(lisp.Record{EID: rec.EID}, find) != nil {
		t.Fatal("a negative record planned tunnels")
	}
}

func TestTunnelsGiveOneIDPerPairStartingAtOne(t *testing.T) {
	var ts Tunnels
	a := Tunnel{0, netip.MustParseAddr("172.31.1.2")}
	b := Tunnel{1, netip.MustParseAddr("172.31.2.2")}
	id, isNew, ok := ts.ID(a)
	if id != 1 || !isNew || !ok {
		t.Fatalf("first id %d new=%v ok=%v", id, isNew, ok)
	}
	if id, isNew, _ := ts.ID(a); id != 1 || isNew {
		t.Fatalf("same tunnel got %d new=%v", id, isNew)
	}
	if id, _, _ := ts.ID(b); id != 2 {
		t.Fatalf("second tunnel got %d", id)
	}
	if tn, ok := ts.Of(2); !ok || tn != b {
		t.Fatalf("Of(2) = %v %v", tn, ok)
	}
}

func TestCacheResolvesOncePerPrefixAndAgainWhenTheTTLRunsOut(t *testing.T) {
	var c Cache
	t0 := time.Unix(1000, 0)
	e1, e2 := netip.MustParseAddr("10.77.0.1"), netip.MustParseAddr("10.77.0.2")
	if !c.Seen(e1, t0) {
		t.Fatal("a new EID is not due at once")
	}
	if c.Seen(e1, t0) {
		t.Fatal("the same EID asked twice")
	}
	ch := []Choice{{Tunnel{0, netip.MustParseAddr("172.31.1.2")}, 1, 1}}
	rec := lisp.Record{EID: netip.MustParsePrefix("10.77.0.0/24"), TTL: time.Minute, Locators: []lisp.Locator{{Addr: ch[0].Remote, Priority: 1}}}
	if rm := c.Resolved(e1, rec, ch, t0); rm.IsValid() {
		t.Fatalf("first answer removes %s", rm)
	}
	if c.Seen(e2, t0) {
		t.Fatal("an EID inside a resolved prefix asked again")
	}
	if d := c.Due(t0.Add(59 * time.Second)); len(d) != 0 {
		t.Fatalf("due before the TTL: %v", d)
	}
	if !c.Next().Equal(t0.Add(time.Minute)) {
		t.Fatalf("next %v", c.Next())
	}
	if d := c.Due(t0.Add(time.Minute)); len(d) != 1 || d[0] != e1 {
		t.Fatalf("due at TTL: %v", d)
	}
	c.Failed(e1, t0.Add(time.Minute))
	if d := c.Due(t0.Add(time.Minute + Retry - 1)); len(d) != 0 {
		t.Fatalf("a failed request asked again before Retry: %v", d)
	}
	if rm := c.Resolved(e1, lisp.Record{EID: rec.EID}, nil, t0.Add(2*time.Minute)); rm != rec.EID {
		t.Fatalf("negative answer removes %v; want %s", rm, rec.EID)
	}
	if len(c.Entries()) != 0 || !c.Seen(e2, t0) {
		t.Fatal("a negative answer did not end the entry")
	}
}

// lispSYN builds the frame an access gateway's datapath sends: outer
// IPv4/UDP 4341/LISP around a TCP segment with flags.
func lispSYN(t *testing.T, syn, ack bool, dport uint16, frag bool) []byte {
	t.Helper()
	inner := gopacket.NewSerializeBuffer()
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolTCP, SrcIP: []byte{10, 77, 0, 2}, DstIP: []byte{10, 88, 0, 10}}
	tcp := &layers.TCP{SrcPort: 40000, DstPort: 5201, SYN: syn, ACK: ack, Window: 100}
	tcp.SetNetworkLayerForChecksum(ip)
	opts := gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}
	if err := gopacket.SerializeLayers(inner, opts, ip, tcp); err != nil {
		t.Fatal(err)
	}
	payload := append([]byte{0x80, 0, 0, 1, 0, 0, 0, 0}, inner.Bytes()...)
	out := gopacket.NewSerializeBuffer()
	oip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: []byte{172, 31, 2, 2}, DstIP: []byte{172, 31, 2, 130}}
	if frag {
		oip.FragOffset = 10
	}
	udp := &layers.UDP{SrcPort: 49152, DstPort: layers.UDPPort(dport)}
	udp.SetNetworkLayerForChecksum(oip)
	eth := &layers.Ethernet{SrcMAC: []byte{2, 0, 0, 0, 0, 1}, DstMAC: []byte{2, 0, 0, 0, 0, 2}, EthernetType: layers.EthernetTypeIPv4}
	if err := gopacket.SerializeLayers(out, opts, eth, oip, udp, gopacket.Payload(payload)); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

func TestSynOfReadsOnlyEncapsulatedSYNs(t *testing.T) {
	frame := lispSYN(t, true, false, 4341, false)
	s, ok := SynOf(frame)
	if !ok || s.OuterSrc != netip.MustParseAddr("172.31.2.2") || s.OuterDst != netip.MustParseAddr("172.31.2.130") || s.EID != netip.MustParseAddr("10.77.0.2") {
		t.Fatalf("SynOf(SYN) = %+v %v", s, ok)
	}
	if inner := frame[14+20+8+8:]; string(s.Inner) != string(inner) || len(s.Inner) != 40 {
		t.Fatalf("inner packet %x, want %x (40 bytes)", s.Inner, inner)
	}
	for name, f := range map[string][]byte{
		"ack":      lispSYN(t, false, true, 4341, false),
		"not 4341": lispSYN(t, true, false, 4342, false),
		"fragment": lispSYN(t, true, false, 4341, true),
		"cut":      lispSYN(t, true, false, 4341, false)[:60],
		"empty":    nil,
	} {
		if _, ok := SynOf(f); ok {
			t.Errorf("%s: read as a SYN", name)
		}
	}
}

func TestFixTCPChecksumMakesTheSumGopacketComputes(t *testing.T) {
	frame := lispSYN(t, true, false, 4341, false)
	s, ok := SynOf(frame)
	if !ok {
		t.Fatal("no SYN")
	}
	want := append([]byte(nil), s.Inner...)
	s.Inner[20+16], s.Inner[20+17] = 0x12, 0x34 // what an offload left
	FixTCPChecksum(s.Inner)
	if string(s.Inner) != string(want) {
		t.Fatalf("checksum %x, want %x", s.Inner[36:38], want[36:38])
	}
}

type probeClock struct{ t time.Time }

func (c *probeClock) now() time.Time { return c.t }

func probeMsg(t *testing.T, nonce uint64, probe bool) []byte {
	t.Helper()
	req := lisp.NewProbe(nonce, netip.MustParseAddr("192.168.71.1"), netip.MustParsePrefix("10.88.0.0/24"))
	req.Probe = probe
	b, err := req.Encode()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The responder answers a probe with the nonce echoed, refuses a plain
// Map-Request and garbage, and bounds each source to ProbeBurst answers at
// once then ProbeRate a second, while another source is still answered.
func TestResponderAnswersProbesAndBoundsEachSource(t *testing.T) {
	clk := &probeClock{t: time.Unix(1000, 0)}
	cfg := Config{RLOCs: []RLOC{{Dev: "s1", Priority: 1, Weight: 50}, {Dev: "s2", Priority: 1, Weight: 50}},
		EIDPrefixes: []netip.Prefix{netip.MustParsePrefix("10.88.0.0/24")}, TTL: DefaultTTL}
	local := netip.MustParseAddr("192.168.71.2")
	r := NewResponder(cfg.Records([]netip.Addr{local, netip.MustParseAddr("192.168.72.2")}), clk.now)
	src := netip.MustParseAddrPort("192.168.71.1:40000")
	out := r.Answer(probeMsg(t, 42, true), src, local)
	rep, err := lisp.DecodeMapReply(out)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Probe || rep.Nonce != 42 || len(rep.Records[0].Locators) != 2 || !rep.Records[0].Locators[0].Probed {
		t.Fatalf("answer %+v: want P, nonce 42, both locators, the first flagged probed", rep)
	}
	if len(out) > lisp.MaxProbeReplyLen {
		t.Fatalf("answer of %d bytes", len(out))
	}
	if r.Answer(probeMsg(t, 43, false), src, local) != nil || r.Answer([]byte{0x10, 1}, src, local) != nil {
		t.Fatal("answered a plain map-request or garbage")
	}
	n := 1
	for r.Answer(probeMsg(t, 44, true), src, local) != nil {
		n++
	}
	if n != ProbeBurst {
		t.Fatalf("%d answers at once to one source, want the burst %d", n, ProbeBurst)
	}
	if r.Answer(probeMsg(t, 45, true), netip.MustParseAddrPort("192.168.72.1:40000"), local) == nil {
		t.Fatal("another source was refused while the first was limited")
	}
	clk.t = clk.t.Add(time.Second)
	n = 0
	for r.Answer(probeMsg(t, 46, true), src, local) != nil {
		n++
	}
	if n != ProbeRate {
		t.Fatalf("%d answers a second later, want %d", n, ProbeRate)
	}
	st := r.Stats()
	if st.Answered != uint64(ProbeBurst+1+ProbeRate) || st.Refused != 2 || st.RateLimited != 2 {
		t.Fatalf("stats %+v", st)
	}
}
