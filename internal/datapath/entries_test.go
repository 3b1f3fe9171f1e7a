package datapath

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/bpftest"
	"github.com/onehop/onehop/internal/intent"
)

func TestIPKeyIsTheAddressBytesInOrder(t *testing.T) {
	a := netip.MustParseAddr("10.1.2.3")
	k := IPKey(a)
	if KeyIP(k) != a {
		t.Fatalf("round trip %s -> %#x -> %s", a, k, KeyIP(k))
	}
}

func TestCompileRejectsBadDesiredState(t *testing.T) {
	cases := []struct {
		name string
		edit func(*intent.Desired)
		want string
	}{
		{"bad vm net", func(d *intent.Desired) { d.VMNet = "ten" }, "vm network"},
		{"bad local ip", func(d *intent.Desired) { d.Local[0].IP = "10.1.1" }, "not IPv4"},
		{"ipv6 local", func(d *intent.Desired) { d.Local[0].IP = "fd00::1" }, "not IPv4"},
		{"bad local mac", func(d *intent.Desired) { d.Local[0].MAC = "zz" }, "not an Ethernet address"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := testDesired()
			c.edit(&d)
			_, _, err := Compile(d, h1Uplink, testIfindex)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want it to mention %q", err, c.want)
			}
		})
	}
}

func TestCompileLeavesOutVMsWhoseVifIsMissing(t *testing.T) {
	d := testDesired()
	d.Local[1].Interface = "vif-gone"
	e, missing, err := Compile(d, h1Uplink, testIfindex)
	if err != nil {
		t.Fatal(err)
	}
	if len(missing) != 1 || missing[0] != "vif-gone" {
		t.Fatalf("missing %v", missing)
	}
	if _, ok := e.Endpoints[IPKey(web3)]; ok {
		t.Fatal("entry for a VM without a vif")
	}
	if len(e.Endpoints) != 1 || len(e.Vifs) != 1 {
		t.Fatalf("endpoints %d vifs %d", len(e.Endpoints), len(e.Vifs))
	}
}

func TestCompileConfigCarriesUplinkAndTenantSpace(t *testing.T) {
	e, _, err := Compile(testDesired(), h1Uplink, testIfindex)
	if err != nil {
		t.Fatal(err)
	}
	if e.Config.UplinkIfindex != 7 || KeyIP(e.Config.VmNet).String() != "10.0.0.0" || KeyIP(e.Config.VmMask).String() != "255.0.0.0" {
		t.Fatalf("config %+v", e.Config)
	}
	if _, ok := e.Endpoints[IPKey(web2)]; ok {
		t.Fatal("a remote VM in the local endpoint table")
	}
}

func TestCompileSetsProxyARPOnlyForListedFarms(t *testing.T) {
	d := testDesired()
	d.ProxyARPFarms = []uint16{2}
	e, _, err := Compile(d, h1Uplink, testIfindex)
	if err != nil {
		t.Fatal(err)
	}
	for id, f := range e.Farms {
		if want := uint32(boolByte(id == 2)); f.Flags != want {
			t.Fatalf("farm %d flags %d, want %d", id, f.Flags, want)
		}
	}
}

func TestCompileHostsLeavesOutItselfAndNamesBrokenRecords(t *testing.T) {
	hosts, err := CompileHosts([]intent.Node{
		{Name: "h1", UplinkMAC: "aa:00:00:00:00:01"},
		{Name: "h2", UplinkMAC: "aa:00:00:00:00:02"},
		{Name: "h3", UplinkMAC: "aa:00:00:00:00"},
	}, "h1")
	if err == nil || !strings.Contains(err.Error(), "node h3") {
		t.Errorf("error %v, want one naming node h3", err)
	}
	want := map[HostKey]uint8{hostKey(bpftest.MustMAC("aa:00:00:00:00:02")): 1}
	if !reflect.DeepEqual(hosts, want) {
		t.Errorf("hosts %v, want only h2", hosts)
	}
}
