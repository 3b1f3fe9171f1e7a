package tappolicy

import (
	"errors"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/intent"
)

func TestParseRefReadsEveryFormAndNamesWhatIsWrong(t *testing.T) {
	cases := []struct {
		in   string
		want Ref
		err  string
	}{
		{in: "blue/web/web1", want: Ref{Kind: KindVM, Farm: "blue", Subnet: "web", Name: "web1"}},
		{in: "blue/web", want: Ref{Kind: KindSubnet, Farm: "blue", Subnet: "web"}},
		{in: "any", want: Ref{Kind: KindAny}},
		{in: "10.1.1.2", want: Ref{Kind: KindIP, IP: netip.MustParseAddr("10.1.1.2")}},
		{in: "02:00:0A:01:01:02", want: Ref{Kind: KindMAC, MAC: "02:00:0a:01:01:02"}},
		{in: "", err: "empty"},
		{in: "ANY", err: "want farm/subnet/vm"},
		{in: "*", err: "want farm/subnet/vm"},
		{in: "blue", err: "want farm/subnet/vm"},
		{in: "blue/web/web1/x", err: "has 4 parts"},
		{in: "Blue/web", err: `farm name "Blue"`},
		{in: "blue//web1", err: `subnet name ""`},
		{in: "blue/web/", err: `vm name ""`},
		{in: "blue/web/web-1", err: `vm name "web-1"`},
		{in: "blue/web/averylongname", err: `vm name "averylongname"`},
		{in: "fe80::1", err: "not an IPv4 address"},
		{in: "10.1.1.256", err: "want farm/subnet/vm"},
		{in: "02-00-0a-01-01-02-03-04", err: "not a 6-byte"},
	}
	for _, tc := range cases {
		got, err := ParseRef(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseRef(%q) = %+v, %v; want error with %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ParseRef(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}

func spec(mod func(*Spec)) Spec {
	s := Spec{Name: "web-http", Sender: "blue/web/web1", Receiver: "blue/db", Monitor: "blue/ops/mon"}
	if mod != nil {
		mod(&s)
	}
	return s
}

func TestParseSpecErrorsNameTheFlag(t *testing.T) {
	cases := []struct {
		name  string
		spec  Spec
		field string
		msg   string
	}{
		{"bad name", spec(func(s *Spec) { s.Name = "Web" }), "name", "1-32 lowercase"},
		{"long name", spec(func(s *Spec) { s.Name = strings.Repeat("a", 33) }), "name", "1-32 lowercase"},
		{"no sender", spec(func(s *Spec) { s.Sender = "" }), "sender", "empty"},
		{"bad receiver", spec(func(s *Spec) { s.Receiver = "blue" }), "receiver", "want farm/subnet/vm"},
		{"subnet monitor", spec(func(s *Spec) { s.Monitor = "blue/ops" }), "monitor", "not one VM"},
		{"any monitor", spec(func(s *Spec) { s.Monitor = "any" }), "monitor", "not one VM"},
		{"proto word", spec(func(s *Spec) { s.Proto = "sctp" }), "proto", "want tcp, udp, icmp"},
		{"proto 256", spec(func(s *Spec) { s.Proto = "256" }), "proto", "0-255"},
		{"sport 0", spec(func(s *Spec) { s.Sport = "0" }), "sport", "port 0 is not a port"},
		{"sport 65536", spec(func(s *Spec) { s.Sport = "65536" }), "sport", "1 <= N <= M <= 65535"},
		{"dport reversed", spec(func(s *Spec) { s.Dport = "90-80" }), "dport", "ends below its start"},
		{"dport junk", spec(func(s *Spec) { s.Dport = "80-" }), "dport", "want a port N"},
		{"ports with icmp", spec(func(s *Spec) { s.Proto = "icmp"; s.Dport = "80" }), "dport", "needs proto tcp, udp or any"},
		{"ports with proto 47", spec(func(s *Spec) { s.Proto = "47"; s.Sport = "80" }), "sport", "not 47"},
		{"vlan 0", spec(func(s *Spec) { s.VLAN = "0" }), "vlan", "1-65535"},
		{"vlan 65536", spec(func(s *Spec) { s.VLAN = "65536" }), "vlan", "1-65535"},
		{"vlan of farm 0", spec(func(s *Spec) { s.VLAN = "12" }), "vlan", "not a segment"},
		{"vlan of subnet 0", spec(func(s *Spec) { s.VLAN = "512" }), "vlan", "not a segment"},
	}
	for _, tc := range cases {
		_, err := ParseSpec(tc.spec)
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field || !strings.Contains(fe.Msg, tc.msg) {
			t.Errorf("%s: %v; want field %s with %q", tc.name, err, tc.field, tc.msg)
		}
	}
}

func TestParseSpecReadsFilters(t *testing.T) {
	p, err := ParseSpec(spec(func(s *Spec) {
		s.Proto, s.Sport, s.Dport, s.VLAN, s.BothDirections, s.CrossFarm = "TCP", "1024-65535", "80", "257", true, true
	}))
	want := intent.TapFilter{Proto: 6, SportLo: 1024, SportHi: 65535, DportLo: 80, DportHi: 80, VLAN: 257}
	if err != nil || p.TapFilter != want || !p.BothDirections || !p.CrossFarm || p.Sender != "blue/web/web1" {
		t.Fatalf("%+v %v", p, err)
	}
	if d := Describe(p.TapFilter); d != "proto tcp sport 1024-65535 dport 80 vlan 257" {
		t.Fatalf("describe: %q", d)
	}
	// Ports with proto any are fine (they match TCP and UDP); left out is any.
	if p, err := ParseSpec(spec(func(s *Spec) { s.Proto, s.Dport = "any", "53" })); err != nil || p.Proto != 0 || p.DportLo != 53 {
		t.Fatalf("any+dport: %+v %v", p, err)
	}
	if p, err := ParseSpec(spec(nil)); err != nil || p.TapFilter != (intent.TapFilter{}) || Describe(p.TapFilter) != "all traffic" {
		t.Fatalf("no filters: %+v %v", p, err)
	}
}

func TestCheckFilterNamesTheRecordsFields(t *testing.T) {
	cases := []struct {
		f     intent.TapFilter
		field string
	}{
		{intent.TapFilter{SportHi: 80}, "sportLo"},
		{intent.TapFilter{SportLo: 80}, "sportHi"},
		{intent.TapFilter{DportLo: 90, DportHi: 80}, "dportHi"},
		{intent.TapFilter{Proto: 1, DportLo: 80, DportHi: 80}, "dportLo"},
		{intent.TapFilter{VLAN: 256}, "vlan"},
	}
	for _, tc := range cases {
		var fe *FieldError
		if err := CheckFilter(tc.f); !errors.As(err, &fe) || fe.Field != tc.field {
			t.Errorf("%+v: %v, want field %s", tc.f, err, tc.field)
		}
	}
	if err := CheckFilter(intent.TapFilter{Proto: 17, SportLo: 1, SportHi: 65535, VLAN: 0xffff}); err != nil {
		t.Fatal(err)
	}
}

// world: farm blue (id 1) with web (1), db (2), ops (3); farm red (id 2)
// with app (1), which peers with blue both ways; farm green (id 3) with
// lan (1), which blue peers with but green does not peer back.
func world() *World {
	farms := []intent.Farm{
		{Name: "blue", ID: 1, Peers: []string{"green", "red"}},
		{Name: "red", ID: 2, Peers: []string{"blue"}},
		{Name: "green", ID: 3},
	}
	subnets := []intent.Subnet{
		{Farm: "blue", Name: "web", ID: 1}, {Farm: "blue", Name: "db", ID: 2}, {Farm: "blue", Name: "ops", ID: 3},
		{Farm: "red", Name: "app", ID: 1}, {Farm: "green", Name: "lan", ID: 1},
	}
	vms := []intent.VM{
		intent.NewVM("blue", "web", "web1", "h1", netip.MustParseAddr("10.1.1.2")),
		intent.NewVM("blue", "web", "web2", "h2", netip.MustParseAddr("10.1.1.3")),
		intent.NewVM("blue", "db", "db1", "h2", netip.MustParseAddr("10.1.2.2")),
		intent.NewVM("blue", "ops", "mon", "h3", netip.MustParseAddr("10.1.3.2")),
		intent.NewVM("red", "app", "app1", "h1", netip.MustParseAddr("10.2.1.2")),
		intent.NewVM("red", "app", "rmon", "h3", netip.MustParseAddr("10.2.1.3")),
		intent.NewVM("green", "lan", "gr1", "h1", netip.MustParseAddr("10.3.1.2")),
	}
	return NewWorld(farms, subnets, vms)
}

func pol(sender, receiver, monitor string, mod func(*intent.TapPolicy)) intent.TapPolicy {
	p := intent.TapPolicy{Name: "t", ID: 7, Sender: sender, Receiver: receiver, Monitor: monitor}
	if mod != nil {
		mod(&p)
	}
	return p
}

func TestResolveStoresVMsByNameWhateverForm(t *testing.T) {
	w := world()
	got, err := w.Resolve(pol("10.1.1.2", "02:00:0a:01:02:02", "02:00:0A:01:03:02", nil))
	if err != nil {
		t.Fatal(err)
	}
	if got.Sender != "blue/web/web1" || got.Receiver != "blue/db/db1" || got.Monitor != "blue/ops/mon" {
		t.Fatalf("resolved %+v", got)
	}
	if got, err := w.Resolve(pol("blue/web", "any", "10.1.3.2", nil)); err != nil || got.Sender != "blue/web" || got.Receiver != "any" || got.Monitor != "blue/ops/mon" {
		t.Fatalf("subnet/any: %+v %v", got, err)
	}
}

func TestResolveRefusesWhatCannotBeEnforced(t *testing.T) {
	w := world()
	cross := func(p *intent.TapPolicy) { p.CrossFarm = true }
	vlan := func(n uint16) func(*intent.TapPolicy) { return func(p *intent.TapPolicy) { p.VLAN = n } }
	cases := []struct {
		name  string
		p     intent.TapPolicy
		field string
		msg   string
	}{
		{"unknown vm", pol("blue/web/nope", "any", "blue/ops/mon", nil), "sender", "no vm blue/web/nope"},
		{"unknown subnet", pol("any", "blue/nope", "blue/ops/mon", nil), "receiver", "no subnet blue/nope"},
		{"unknown ip", pol("10.1.1.99", "any", "blue/ops/mon", nil), "sender", "no VM has address 10.1.1.99"},
		{"unknown mac", pol("any", "02:00:0a:01:01:63", "blue/ops/mon", nil), "receiver", "no VM has MAC 02:00:0a:01:01:63"},
		{"unknown monitor", pol("any", "any", "blue/ops/nomon", nil), "monitor", "no vm blue/ops/nomon"},
		{"subnet monitor", pol("any", "any", "blue/ops", nil), "monitor", "not one VM"},
		{"self traffic", pol("blue/web/web1", "10.1.1.2", "blue/ops/mon", nil), "receiver", "also the sender"},
		{"monitor is sender", pol("blue/ops/mon", "any", "blue/ops/mon", nil), "monitor", "the policy's sender"},
		{"monitor is receiver", pol("any", "10.1.3.2", "blue/ops/mon", nil), "monitor", "the policy's receiver"},
		{"other farm's sender", pol("red/app/app1", "blue/web/web1", "blue/ops/mon", nil), "monitor", "unless the policy is cross-farm"},
		{"other farm's receiver", pol("blue/web/web1", "red/app", "blue/ops/mon", nil), "monitor", "the receiver in farm red"},
		{"other farm's monitor", pol("blue/web", "any", "red/app/rmon", nil), "monitor", "the monitor is in farm red and the sender in farm blue"},
		{"cross-farm, one-way peering", pol("green/lan/gr1", "any", "blue/ops/mon", cross), "monitor", "onehop peer green blue"},
		{"vlan of no subnet", pol("any", "any", "blue/ops/mon", vlan(1*256+9)), "vlan", "no subnet has those ids"},
		{"vlan of another farm for any", pol("any", "any", "blue/ops/mon", vlan(2*256+1)), "vlan", "outside farm red"},
		{"vlan not the sender's subnet", pol("blue/db", "any", "blue/ops/mon", vlan(257)), "vlan", "the sender is subnet blue/db"},
		{"vlan not the sender vm's subnet", pol("blue/db/db1", "any", "blue/ops/mon", vlan(257)), "vlan", "not in it"},
		{"bad filter", pol("any", "any", "blue/ops/mon", func(p *intent.TapPolicy) { p.SportLo = 5 }), "sportHi", "without sportHi"},
		{"bad name", pol("any", "any", "blue/ops/mon", func(p *intent.TapPolicy) { p.Name = "" }), "name", "1-32"},
	}
	for _, tc := range cases {
		_, err := w.Resolve(tc.p)
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field || !strings.Contains(fe.Msg, tc.msg) {
			t.Errorf("%s: %v; want field %s with %q", tc.name, err, tc.field, tc.msg)
		}
	}
	// Cross-farm with a mutual peering is allowed, either end.
	for _, p := range []intent.TapPolicy{
		pol("red/app/app1", "blue/web/web1", "blue/ops/mon", cross),
		pol("blue/web", "red/app", "red/app/rmon", cross),
		pol("any", "any", "blue/ops/mon", cross), // nothing to cross: allowed
	} {
		if _, err := w.Resolve(p); err != nil {
			t.Errorf("%+v: %v", p, err)
		}
	}
}

func TestRulesCompileEachDirection(t *testing.T) {
	w := world()
	p := pol("blue/web/web1", "any", "blue/ops/mon", func(p *intent.TapPolicy) {
		p.BothDirections = true
		p.TapFilter = intent.TapFilter{Proto: 6, SportLo: 1024, SportHi: 2048, DportLo: 80, DportHi: 80, VLAN: 257}
	})
	rules, err := w.Rules(p)
	if err != nil {
		t.Fatal(err)
	}
	want := []intent.TapRule{
		{ID: 7, Policy: "t", Sender: intent.TapEnd{Kind: "vm", IP: "10.1.1.2"}, Receiver: intent.TapEnd{Kind: "any", Farm: 1},
			TapFilter: p.TapFilter, MonitorIP: "10.1.3.2", MonitorHost: "h3"},
		{ID: 7 | intent.TapReverse, Policy: "t", Sender: intent.TapEnd{Kind: "any", Farm: 1}, Receiver: intent.TapEnd{Kind: "vm", IP: "10.1.1.2"},
			TapFilter: intent.TapFilter{Proto: 6, SportLo: 80, SportHi: 80, DportLo: 1024, DportHi: 2048}, MonitorIP: "10.1.3.2", MonitorHost: "h3"},
	}
	if !reflect.DeepEqual(rules, want) {
		t.Fatalf("rules\n%+v\nwant\n%+v", rules, want)
	}
	// A vlan narrows `any` to its subnet, so the reverse keeps the meaning.
	rules, err = w.Rules(pol("any", "blue/db", "blue/ops/mon", func(p *intent.TapPolicy) { p.VLAN = 257; p.BothDirections = true }))
	if err != nil {
		t.Fatal(err)
	}
	web := intent.TapEnd{Kind: "subnet", Farm: 1, Subnet: 1}
	if rules[0].Sender != web || rules[1].Receiver != web || rules[1].VLAN != 0 || rules[0].VLAN != 257 {
		t.Fatalf("vlan-narrowed rules %+v", rules)
	}
	// A VM the policy names is gone: no rules.
	gone := NewWorld(nil, nil, nil)
	if _, err := gone.Rules(p); err == nil {
		t.Fatal("rules for a policy whose VMs are gone")
	}
}

func TestRulesDropAPolicyWhosePeeringWasWithdrawn(t *testing.T) {
	p := pol("red/app/app1", "blue/web/web1", "blue/ops/mon", func(p *intent.TapPolicy) { p.CrossFarm = true })
	if _, err := world().Rules(p); err != nil {
		t.Fatal(err)
	}
	w := world()
	f := w.farms["red"]
	f.Peers = nil
	w.farms["red"] = f
	if r, err := w.Rules(p); err == nil || !strings.Contains(err.Error(), "do not peer") {
		t.Fatalf("after red withdrew: %+v %v", r, err)
	}
}

func TestMatchesKnowsWhichVMsAnEndNames(t *testing.T) {
	web1 := intent.NewVM("blue", "web", "web1", "h1", netip.MustParseAddr("10.1.1.2"))
	db1 := intent.NewVM("blue", "db", "db1", "h1", netip.MustParseAddr("10.1.2.2"))
	app1 := intent.NewVM("red", "app", "app1", "h1", netip.MustParseAddr("10.2.1.2"))
	cases := []struct {
		end  intent.TapEnd
		want [3]bool // web1, db1, app1
	}{
		{intent.TapEnd{Kind: "vm", IP: "10.1.1.2"}, [3]bool{true, false, false}},
		{intent.TapEnd{Kind: "subnet", Farm: 1, Subnet: 2}, [3]bool{false, true, false}},
		{intent.TapEnd{Kind: "any", Farm: 1}, [3]bool{true, true, false}},
		{intent.TapEnd{Kind: "any", Farm: 2}, [3]bool{false, false, true}},
		{intent.TapEnd{Kind: "bogus"}, [3]bool{}},
	}
	for _, tc := range cases {
		got := [3]bool{Matches(tc.end, web1), Matches(tc.end, db1), Matches(tc.end, app1)}
		if got != tc.want {
			t.Errorf("%+v: %v, want %v", tc.end, got, tc.want)
		}
	}
}

// fabricNodes: h1 and h2 on 192.168.50.0/24.
var fabricNodes = []intent.Node{
	{Name: "h1", UplinkIP: "192.168.50.11", Uplinks: []intent.NodeUplink{{Name: "uplink0", IP: "192.168.50.11", Bits: 24}}},
	{Name: "h2", UplinkIP: "192.168.50.12", Uplinks: []intent.NodeUplink{{Name: "uplink0", IP: "192.168.50.12", Bits: 24}}},
}

func TestACollectorMustBeOnTheFabricWithAKnownEncapsulation(t *testing.T) {
	w := world().WithFabric(fabricNodes)
	col := func(addr, encap string) func(*intent.TapPolicy) {
		return func(p *intent.TapPolicy) { p.Collector, p.Encap = addr, encap }
	}
	got, err := w.Resolve(pol("10.1.1.2", "any", "", col("192.168.50.200", "")))
	if err != nil {
		t.Fatal(err)
	}
	if got.Sender != "blue/web/web1" || got.Monitor != "" || got.Collector != "192.168.50.200" || got.Encap != EncapERSPAN2 {
		t.Fatalf("resolved %+v", got)
	}
	cases := []struct {
		name  string
		p     intent.TapPolicy
		field string
		msg   string
	}{
		{"off the fabric", pol("blue/web/web1", "any", "", col("192.168.60.5", "gre")), "collector", "not on the fabric (192.168.50.0/24)"},
		{"a host's own address", pol("blue/web/web1", "any", "", col("192.168.50.12", "")), "collector", "host h2's own address"},
		{"not an address", pol("blue/web/web1", "any", "", col("collector1", "")), "collector", "not an IPv4 address"},
		{"unknown encapsulation", pol("blue/web/web1", "any", "", col("192.168.50.200", "vxlan")), "encap", `unknown encapsulation "vxlan": want erspan2, erspan3, gre`},
		{"monitor and collector", pol("blue/web/web1", "any", "blue/ops/mon", col("192.168.50.200", "")), "collector", "not both"},
		{"neither", pol("blue/web/web1", "any", "", nil), "monitor", "no monitor and no collector"},
		{"encap without collector", pol("blue/web/web1", "any", "blue/ops/mon", col("", "gre")), "encap", "without a collector"},
		{"both any", pol("any", "any", "", col("192.168.50.200", "")), "receiver", "both any"},
		{"two farms without consent", pol("blue/web/web1", "red/app", "", col("192.168.50.200", "")), "receiver", "--cross-farm"},
	}
	for _, tc := range cases {
		_, err := w.Resolve(tc.p)
		var fe *FieldError
		if !errors.As(err, &fe) || fe.Field != tc.field || !strings.Contains(fe.Msg, tc.msg) {
			t.Errorf("%s: %v; want field %s with %q", tc.name, err, tc.field, tc.msg)
		}
	}
	// Rules carry the collector and its encapsulation, no monitor; any is
	// the other end's farm.
	rules, err := w.Rules(pol("any", "blue/db/db1", "", func(p *intent.TapPolicy) {
		p.Collector, p.Encap, p.BothDirections = "192.168.50.200", EncapERSPAN3, true
	}))
	if err != nil {
		t.Fatal(err)
	}
	want := []intent.TapRule{
		{ID: 7, Policy: "t", Sender: intent.TapEnd{Kind: "any", Farm: 1}, Receiver: intent.TapEnd{Kind: "vm", IP: "10.1.2.2"}, Collector: "192.168.50.200", Encap: "erspan3"},
		{ID: 7 | intent.TapReverse, Policy: "t", Sender: intent.TapEnd{Kind: "vm", IP: "10.1.2.2"}, Receiver: intent.TapEnd{Kind: "any", Farm: 1}, Collector: "192.168.50.200", Encap: "erspan3"},
	}
	if !reflect.DeepEqual(rules, want) {
		t.Fatalf("rules\n%+v\nwant\n%+v", rules, want)
	}
}
