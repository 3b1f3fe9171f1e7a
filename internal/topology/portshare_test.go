package topology

import (
	"slices"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/intent"
)

func TestPortshareExampleIsValid(t *testing.T) {
	f, err := Load("../../examples/portshare.yaml")
	if err != nil {
		t.Fatal(err)
	}
	ss, es := f.Slivers(), f.Externals()
	if len(f.Hosts) != 2 || len(ss) != 3 || len(es) != 1 || es[0].Name != "inet" {
		t.Fatalf("hosts %+v slivers %+v externals %+v", f.Hosts, ss, es)
	}
	want := []intent.Lease{{Uplink: 0, Lo: 10000, Hi: 10099}}
	if s, _ := f.SliverByName("s1"); s.Host != "h1" || !slices.Equal(s.Leases, want) {
		t.Fatalf("s1 %+v", s)
	}
	// The external comes after the hosts and the controller.
	if f.Fabric.Controller != "192.168.100.1" || f.Hosts[1].Address != "192.168.100.11" || es[0].Address != "192.168.100.12" {
		t.Fatalf("addresses: controller %s hosts %+v inet %s", f.Fabric.Controller, f.Hosts, es[0].Address)
	}
}

const shared = `name: t
hosts:
  - name: h1
  - name: h2
    uplinks: 2
slivers:
  - {name: s1, host: h1, ports: 10000-10099}
  - {name: s2, host: h2, ports: "10000-10099,1:20000-20099"}
externals:
  - name: inet
`

func TestSliversExternalsAndUplinksGetTheirAddresses(t *testing.T) {
	f, err := Parse("t.yaml", []byte(shared))
	if err != nil {
		t.Fatal(err)
	}
	h1, _ := f.HostByName("h1")
	h2, _ := f.HostByName("h2")
	// Hosts keep the addresses they had before uplinks and externals
	// existed; the external comes next, the extra uplink after everything.
	if h1.Uplinks != 1 || !slices.Equal(h1.UplinkAddrs, []string{"192.168.100.10"}) {
		t.Errorf("h1 %+v", h1)
	}
	if h2.Uplinks != 2 || !slices.Equal(h2.UplinkAddrs, []string{"192.168.100.11", "192.168.100.13"}) {
		t.Errorf("h2 %+v", h2)
	}
	if e, ok := f.ExternalByName("inet"); !ok || e.Address != "192.168.100.12" || e.Line != 10 {
		t.Errorf("inet %+v", e)
	}
	s2, _ := f.SliverByName("s2")
	if want := []intent.Lease{{Uplink: 0, Lo: 10000, Hi: 10099}, {Uplink: 1, Lo: 20000, Hi: 20099}}; !slices.Equal(s2.Leases, want) {
		t.Errorf("s2 leases %+v, want %+v", s2.Leases, want)
	}
	if !slices.Equal(s2.Uplinks(), []int{0, 1}) || s2.Line != 8 || s2.PortsLine != 8 {
		t.Errorf("s2 %+v uplinks %v", s2, s2.Uplinks())
	}
	if in := s2.Intent(); in.Host != "h2" || in.Name != "s2" || in.Slot != 0 || len(in.Leases) != 2 {
		t.Errorf("intent %+v", in)
	}
	// A file without the new keys has none of them, and one uplink each.
	g, err := Parse("t.yaml", []byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if g.Slivers() != nil || g.Externals() != nil || g.Hosts[0].Uplinks != 1 || len(g.Hosts[0].UplinkAddrs) != 1 {
		t.Errorf("plain file: slivers %v externals %v hosts %+v", g.Slivers(), g.Externals(), g.Hosts)
	}
}

func TestExplicitAddressesAreNeverAllocatedAgain(t *testing.T) {
	// .12 is taken by hand by the second external; the first gets the next
	// free one, and the extra uplink the one after.
	f, err := Parse("t.yaml", []byte(strings.Replace(shared, "  - name: inet\n", "  - name: inet\n  - {name: peer, address: 192.168.100.12}\n", 1)))
	if err != nil {
		t.Fatal(err)
	}
	inet, _ := f.ExternalByName("inet")
	h2, _ := f.HostByName("h2")
	if inet.Address != "192.168.100.13" || h2.UplinkAddrs[1] != "192.168.100.14" {
		t.Fatalf("inet %s, h2 uplink1 %s", inet.Address, h2.UplinkAddrs[1])
	}
}

// sliverErrorCases are edits of shared that must be refused, with what the
// error says (and so the line it names).
var sliverErrorCases = []struct{ name, old, new, want string }{
	{"unknown host", "{name: s1, host: h1,", "{name: s1, host: h9,", `t.yaml:7: sliver "s1": host "h9" is not defined under hosts`},
	{"name taken by a host", "{name: s1, host: h1,", "{name: h2, host: h1,", `t.yaml:7: sliver name "h2" is already the host defined on line 4`},
	{"duplicate sliver", "{name: s2, host: h2,", "{name: s1, host: h2,", `t.yaml:8: sliver name "s1" is defined twice (first on line 7)`},
	{"reserved name", "{name: s1, host: h1,", "{name: fabric, host: h1,", `t.yaml:7: sliver name "fabric" is reserved`},
	{"name too long", "{name: s1,", "{name: averylongname,", `t.yaml:7: sliver name "averylongname" must be 1-12`},
	{"backwards range", "ports: 10000-10099}", "ports: 10099-10000}", `t.yaml:7: sliver "s1": ports "10099-10000": lease 1 "10099-10000": range 10099-10000 runs backwards`},
	{"port zero", "ports: 10000-10099}", "ports: 0-10}", `t.yaml:7: sliver "s1": ports "0-10": lease 1 "0-10": port "0"`},
	{"port too big", "ports: 10000-10099}", "ports: 10000-70000}", `port "70000": want a number 1..65535`},
	{"not a range", "ports: 10000-10099}", "ports: lots}", `t.yaml:7: sliver "s1": ports "lots"`},
	{"no ports", "ports: 10000-10099}", "ports: \"\"}", `t.yaml:7: sliver "s1": ports "": empty lease list`},
	{"bad uplink", "ports: 10000-10099}", "ports: \"9:10000-10099\"}", `uplink "9": want a number 0..3`},
	{"own ranges overlap", "ports: 10000-10099}", "ports: \"10000-10099,10050-10060\"}", `leases 10000-10099 and 10050-10060 overlap on ports 10050-10060`},
	{"uplink the host lacks", "ports: 10000-10099}", "ports: \"1:10000-10099\"}", `t.yaml:7: sliver "s1": lease 1:10000-10099 is on uplink 1, but host h1 has 1 uplink(s)`},
	{"host's ephemeral ports", "ports: 10000-10099}", "ports: 32000-33000}", `t.yaml:7: sliver "s1": lease 32000-33000 overlaps host h1's own ephemeral ports 32768-60999`},
	{"too many uplinks", "    uplinks: 2\n", "    uplinks: 5\n", `t.yaml:5: host uplinks "5" must be a whole number from 1 to 4`},
	{"sliver name taken by an external", "  - name: inet\n", "  - name: s2\n", `t.yaml:8: sliver name "s2" is already the external defined on line 10`},
	{"external outside fabric", "  - name: inet\n", "  - {name: inet, address: 10.0.0.1}\n", `t.yaml:10: external inet address 10.0.0.1 is not a usable address of fabric`},
	{"unknown sliver key", "{name: s1, host: h1,", "{name: s1, hots: h1,", `t.yaml:7: unknown key "hots" in sliver`},
}

func TestSliverAndExternalErrorsNameLineAndReason(t *testing.T) {
	for _, c := range sliverErrorCases {
		t.Run(c.name, func(t *testing.T) {
			topo := strings.Replace(shared, c.old, c.new, 1)
			if topo == shared {
				t.Fatalf("edit %q found nothing to replace", c.old)
			}
			_, err := Parse("t.yaml", []byte(topo))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want %q", err, c.want)
			}
			checkErrorLines(t, err)
		})
	}
}

func TestOverlappingLeasesOnOneHostNameBothLines(t *testing.T) {
	topo := shared + "  - name: inet2\n" // lines 11+: more slivers below
	topo = strings.Replace(topo, "externals:\n", "  - {name: s3, host: h1, ports: \"9000-9999,10050-10150\"}\n  - {name: s4, host: h2, ports: \"1:20000-20099\"}\nexternals:\n", 1)
	_, err := Parse("t.yaml", []byte(topo))
	if err == nil {
		t.Fatal("accepted overlapping leases")
	}
	for _, want := range []string{
		`t.yaml:9: sliver "s3": lease 10050-10150 overlaps sliver "s1"'s lease 10000-10099 on host h1 (line 7)`,
		`t.yaml:10: sliver "s4": lease 1:20000-20099 overlaps sliver "s2"'s lease 1:20000-20099 on host h2 (line 8)`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	// The same ports on another host, or on another uplink of one host, are
	// another address's: no overlap.
	ok := strings.Replace(shared, "externals:\n", "  - {name: s3, host: h2, ports: \"1:10000-10099\"}\n  - {name: s4, host: h1, ports: 10100-10199}\nexternals:\n", 1)
	if _, err := Parse("t.yaml", []byte(ok)); err != nil {
		t.Fatal(err)
	}
}

func TestAFullFabricIsReportedOnTheLineThatNeedsAnAddress(t *testing.T) {
	// A /28 has 14 usable addresses: .1 controller, .10-.11 hosts, then
	// .12-.14 (offsets 12..14) for the rest.
	topo := "name: t\nfabric: {cidr: 192.168.7.0/28}\nhosts: [{name: h1}, {name: h2, uplinks: 4}]\nexternals: [{name: a}, {name: b}]\n"
	_, err := Parse("t.yaml", []byte(topo))
	if err == nil || !strings.Contains(err.Error(), "t.yaml:3: host h2 uplink3: no free address left on fabric 192.168.7.0/28") {
		t.Fatalf("err = %v", err)
	}
	checkErrorLines(t, err)
}
