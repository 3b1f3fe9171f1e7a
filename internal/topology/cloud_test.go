package topology

import (
	"strings"
	"testing"
)

func TestCloudAccessExampleIsValid(t *testing.T) {
	f, err := Load("../../examples/cloud-access.yaml")
	if err != nil {
		t.Fatal(err)
	}
	ws, gs, xs := f.WANs(), f.Gateways(), f.XTRs()
	if len(f.Hosts) != 0 || len(ws) != 2 || len(gs) != 1 || len(xs) != 1 || !f.CloudAccess() {
		t.Fatalf("parsed wans %+v gateways %+v xtrs %+v hosts %+v", ws, gs, xs, f.Hosts)
	}
	if ws[0].CIDR != "172.31.1.0/24" || ws[1].RateBits() != 100e6 {
		t.Fatalf("wans %+v", ws)
	}
	if got := ws[1].GatewaySide().String() + " " + ws[1].XTRSide().String(); got != "172.31.2.0/25 172.31.2.128/25" {
		t.Fatalf("wan2 sides %s", got)
	}
	if SideNode(ws[0].GatewaySide()).String() != "172.31.1.2" || SideRouter(ws[0].XTRSide()).String() != "172.31.1.129" || SideNode(ws[0].XTRSide()).String() != "172.31.1.130" {
		t.Fatal("side addresses")
	}
	g := gs[0]
	if g.Address != "192.168.100.10" || strings.Join(g.WANs, ",") != "wan1,wan2" || g.PathEID(1).String() != "10.77.0.2" || g.UsersCIDR != "10.76.0.0/24" {
		t.Fatalf("gateway %+v", g)
	}
	if gw, user := g.UserLink(0); gw.String() != "10.76.0.1/30" || user.String() != "10.76.0.2/30" {
		t.Fatalf("user link %s %s", gw, user)
	}
	x := xs[0]
	if x.Address != "192.168.100.11" || x.XTRAddr().String() != "10.88.0.1" || x.Servers[0].Address != "10.88.0.10" || !x.Servers[0].TakesMPTCP() {
		t.Fatalf("xtr %+v", x)
	}
}

const cloudGood = `name: c
wans:
  - {name: wan1, rate: 100mbit}
  - {name: wan2}
gateways:
  - name: gw
    users: [{name: user}]
xtrs:
  - name: xtr
    servers: [{name: srv}]
`

func TestCloudAccessMistakesNameTheirLine(t *testing.T) {
	for _, tc := range []struct {
		name, from, to, want string
	}{
		{"bad rate", "rate: 100mbit", "rate: fast", `c.yaml:3: wan wan1: rate "fast"`},
		{"long wan name", "name: wan2}", "name: wanwanwanwanwan}", `c.yaml:4: wan name "wanwanwanwanwan"`},
		{"wan twice", "name: wan2}", "name: wan1}", "c.yaml:4: wan name \"wan1\" is defined twice (first on line 3)"},
		{"wan overlaps fabric", "{name: wan2}", "{name: wan2, cidr: 192.168.100.0/24}", "c.yaml:4: wan wan2: cidr 192.168.100.0/24 overlaps the fabric"},
		{"wans overlap", "{name: wan2}", "{name: wan2, cidr: 172.31.1.0/25}", "c.yaml:4: wan wan2: 172.31.1.0/25 overlaps wan wan1's 172.31.1.0/24"},
		{"unknown wan", "  - name: gw\n", "  - name: gw\n    wans: [wan3]\n", `c.yaml:6: gateway gw: wan "wan3" is not defined`},
		{"no users", "    users: [{name: user}]\n", "", "c.yaml:6: gateway gw has no users"},
		{"user is a wan", "{name: user}", "{name: wan1}", `c.yaml:7: user name "wan1" is already the wan defined on line 3`},
		{"eid overlaps", "  - name: xtr\n", "  - name: xtr\n    eid-prefix: 10.77.0.0/16\n", "c.yaml:9: xtr xtr eid-prefix: 10.77.0.0/16 overlaps gateway gw eid-prefix's 10.77.0.0/24"},
		{"server outside", "{name: srv}", "{name: srv, address: 10.1.2.3}", "c.yaml:10: server srv: address 10.1.2.3 is not a usable address of its xtr's eid-prefix 10.88.0.0/24"},
		{"server on xtr", "{name: srv}", "{name: srv, address: 10.88.0.1}", "c.yaml:10: server srv: address 10.88.0.1 is already the xtr itself"},
		{"mptcp flag", "{name: srv}", "{name: srv, mptcp: yes}", "c.yaml:10: server mptcp must be true or false"},
		{"wan without xtr", "  - name: xtr\n", "  - name: xtr\n    wans: [wan1]\n", "c.yaml:4: wan wan2 joins no xtr"},
		{"unknown key", "  - name: gw\n", "  - name: gw\n    colour: red\n", `c.yaml:7: unknown key "colour" in gateway`},
	} {
		src := strings.Replace(cloudGood, tc.from, tc.to, 1)
		if src == cloudGood {
			t.Fatalf("%s: %q not in the file", tc.name, tc.from)
		}
		_, err := Parse("c.yaml", []byte(src))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v\nwant it to contain %q", tc.name, err, tc.want)
		}
	}
	if _, err := Parse("c.yaml", []byte(cloudGood)); err != nil {
		t.Fatalf("good file refused: %v", err)
	}
	if _, err := Parse("c.yaml", []byte("name: c\nwans: [{name: wan1}]\n")); err == nil || !strings.Contains(err.Error(), "no hosts") {
		t.Fatalf("a lab with only wans (no gateway, no xtr, no hosts) gave %v", err)
	}
}
