package agent

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os/exec"
	"reflect"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/arpengine"
	"github.com/onehop/onehop/internal/datapath"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/netns"
	"github.com/onehop/onehop/internal/netns/netnstest"
	"github.com/onehop/onehop/internal/testenv"
)

// scopesOf compiles a node holding VMs at ips (as the router does) and
// returns its scopes: the groups are taken from what the datapath holds.
func scopesOf(t *testing.T, ips ...string) map[datapath.ScopeKey]datapath.ScopeInfo {
	t.Helper()
	d := intent.Desired{Node: "h1", VMNet: "10.0.0.0/8"}
	for i, s := range ips {
		ip := netip.MustParseAddr(s)
		b := ip.As4()
		mac := net.HardwareAddr{0x02, 0x00, b[0], b[1], b[2], b[3]}
		d.Local = append(d.Local, intent.LocalEndpoint{Name: fmt.Sprint("vm", i), IP: s, MAC: mac.String(), Interface: fmt.Sprint("vif-vm", i)})
	}
	next := 10
	e, _, err := datapath.Compile(d, datapath.Uplink{Ifindex: 2, MAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}},
		func(string) (int, error) { next++; return next, nil })
	if err != nil {
		t.Fatal(err)
	}
	return e.Scopes
}

func macs(ss ...string) []net.HardwareAddr {
	out := []net.HardwareAddr{}
	for _, s := range ss {
		m, err := net.ParseMAC(s)
		if err != nil {
			panic(err)
		}
		out = append(out, m)
	}
	return out
}

func TestScopeGroupsAreTheSubnetAndFarmGroupsOfTheLocalVMs(t *testing.T) {
	for _, tc := range []struct {
		name string
		vms  []string
		want []net.HardwareAddr
	}{
		{"no VM, no group", nil, macs()},
		{"one VM: its subnet's and its farm's", []string{"10.1.2.5"}, macs("03:00:0a:01:00:00", "03:00:0a:01:02:00")},
		{"two VMs of a subnet: the same two", []string{"10.1.2.5", "10.1.2.6"}, macs("03:00:0a:01:00:00", "03:00:0a:01:02:00")},
		{"two subnets of a farm: one farm group", []string{"10.1.2.5", "10.1.3.5"},
			macs("03:00:0a:01:00:00", "03:00:0a:01:02:00", "03:00:0a:01:03:00")},
		{"two farms: sorted", []string{"10.7.1.5", "10.1.2.5"},
			macs("03:00:0a:01:00:00", "03:00:0a:01:02:00", "03:00:0a:07:00:00", "03:00:0a:07:01:00")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := ScopeGroups(scopesOf(t, tc.vms...))
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("groups %v, want %v", got, tc.want)
			}
		})
	}
}

func TestScopeGroupOfAVMIsWhereTheARPEngineAsksForIt(t *testing.T) {
	// The fabric's ARP questions for a VM go to arpengine.ScopeMAC of its
	// address: a host holding it must have joined that group.
	vm := netip.MustParseAddr("10.4.9.7")
	got := ScopeGroups(scopesOf(t, vm.String()))
	if want := arpengine.ScopeMAC(vm); len(got) != 2 || !bytes.Equal(got[1], want) {
		t.Fatalf("groups %v: want the farm's and the subnet's, %s, which the ARP engine asks", got, want)
	}
}

func TestGroupDiffLeavesOnlyScopeGroups(t *testing.T) {
	want := macs("03:00:0a:01:00:00", "03:00:0a:01:02:00")
	have := macs("01:00:5e:00:00:01", "03:00:0a:01:02:00", "03:00:0a:09:09:00", "33:33:00:00:00:01", "03:00:0a:01:02:01")
	join, leave := groupDiff(want, have)
	if !reflect.DeepEqual(join, macs("03:00:0a:01:00:00")) {
		t.Errorf("join %v, want only the farm group", join)
	}
	if !reflect.DeepEqual(leave, macs("03:00:0a:09:09:00")) {
		t.Errorf("leave %v, want only the stale scope group (never IPv4/IPv6 groups or a non-scope 03:00:0a address)", leave)
	}
	if j, l := groupDiff(want, want); j != nil || l != nil {
		t.Errorf("in step: join %v leave %v, want nothing", j, l)
	}
}

func TestJoinedGroupsReadsTheUplinksGlobalScopeGroups(t *testing.T) {
	devMcast := `1    lo              1     0     01005e000001
2    up0             1     0     333300000001
2    up0             1     1     03000a010200
2    up0             1     0     03000a010300
2    up0             2     1     03000a010000
2    up0             1     1     01005e7f0001
3    up1             1     1     03000a050500
`
	got, err := joinedGroups(strings.NewReader(devMcast), "up0")
	if err != nil {
		t.Fatal(err)
	}
	// 01:03:00 is held only through a packet socket (no global user): not
	// the agent's to leave; up1's are another link's.
	if want := macs("03:00:0a:01:00:00", "03:00:0a:01:02:00"); !reflect.DeepEqual(got, want) {
		t.Fatalf("joined %v, want %v", got, want)
	}
	if _, err := joinedGroups(strings.NewReader("2 up0 1 x 03000a010200\n"), "up0"); err == nil {
		t.Fatal("a malformed line was read without an error")
	}
}

// maddrs is `ip maddr show dev` of ns's ifname: the link-layer groups, as
// an operator sees them, "static" marking those joined with ip maddr add.
func maddrs(t *testing.T, ns, ifname string) []string {
	t.Helper()
	out, err := exec.Command("ip", "-n", ns, "maddr", "show", "dev", ifname).CombinedOutput()
	if err != nil {
		t.Fatalf("ip maddr show: %v\n%s", err, out)
	}
	var got []string
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "link" {
			got = append(got, strings.Join(f[1:], " "))
		}
	}
	return got
}

func TestPrivilegedUplinkGroupsFollowTheFirstAndLastMemberOfAScope(t *testing.T) {
	testenv.RequireRoot(t, "joins multicast groups on a veth in a namespace")
	testenv.RequireTool(t, "ip")
	ns := netnstest.New(t, "mcast")
	netnstest.Veth(t, "up0", ns, "fab0", ns)
	// Another program's groups: IPv4 (all the kernel keeps too) and one
	// joined the way the agent joins, which must outlive every pass.
	netnstest.IP(t, ns, "maddr", "add", "01:00:5e:7f:00:01", "dev", "up0")
	// A scope group a previous agent left behind for a VM gone since: the
	// new agent adopts it, and leaves it.
	netnstest.IP(t, ns, "maddr", "add", "03:00:0a:09:09:00", "dev", "up0")
	g := NewUplinkGroups("h1", "up0", slog.New(slog.NewTextHandler(io.Discard, nil)))
	pass := func(vms ...string) {
		t.Helper()
		scopes := scopesOf(t, vms...)
		if err := netns.Do(ns, func() error { g.Sync(scopes); return nil }); err != nil {
			t.Fatal(err)
		}
		if g.failures != 0 {
			t.Fatalf("sync of %v failed (%d failures)", vms, g.failures)
		}
	}
	has := func(what string, groups ...string) {
		t.Helper()
		got := strings.Join(maddrs(t, ns, "up0"), ", ")
		for _, m := range groups {
			if !strings.Contains(got, m+" static") {
				t.Fatalf("%s: %s not joined on up0: %s", what, m, got)
			}
		}
	}
	hasNot := func(what string, groups ...string) {
		t.Helper()
		got := strings.Join(maddrs(t, ns, "up0"), ", ")
		for _, m := range groups {
			if strings.Contains(got, m) {
				t.Fatalf("%s: %s still on up0: %s", what, m, got)
			}
		}
	}
	farm, sub2, sub3 := "03:00:0a:01:00:00", "03:00:0a:01:02:00", "03:00:0a:01:03:00"

	// Positive control: the test sees a group joined by hand.
	has("joined by ip maddr add", "01:00:5e:7f:00:01", "03:00:0a:09:09:00")
	hasNot("before any VM", farm, sub2, sub3)

	pass("10.1.2.5")
	has("first VM of 10.1.2.0/24", farm, sub2)
	hasNot("first VM of 10.1.2.0/24", sub3, "03:00:0a:09:09:00")
	changes := g.changes

	pass("10.1.2.5", "10.1.2.6")
	if g.changes != changes {
		t.Fatalf("a second VM of the subnet changed the groups (%d changes, were %d)", g.changes, changes)
	}
	has("second VM of 10.1.2.0/24", farm, sub2)

	pass("10.1.2.6", "10.1.3.5")
	has("a VM of another subnet of the farm", farm, sub2, sub3)

	// Level-triggered: a group lost behind the agent's back comes back.
	netnstest.IP(t, ns, "maddr", "del", sub3, "dev", "up0")
	hasNot("deleted by hand", sub3)
	pass("10.1.2.6", "10.1.3.5")
	has("after the next pass", sub3)

	pass("10.1.3.5")
	hasNot("last VM of 10.1.2.0/24 gone", sub2)
	has("10.1.3.0/24 still has a VM", farm, sub3)

	pass()
	hasNot("last VM of the farm gone", farm, sub2, sub3)
	has("another program's group", "01:00:5e:7f:00:01")
	if g.joined != 0 {
		t.Fatalf("%d groups counted as joined, want 0", g.joined)
	}
}
