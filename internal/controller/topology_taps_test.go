package controller

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
)

func storedTaps(t *testing.T, s store.Store) string {
	t.Helper()
	return storedTapsAs(t, s, func(p intent.TapPolicy) string {
		return fmt.Sprintf("%s#%d=%s>%s@%s", p.Name, p.ID, p.Sender, p.Receiver, p.Monitor)
	})
}

// storedTapsAs is the store's TAP policies, by name, each as format says.
func storedTapsAs(t *testing.T, s store.Store, format func(intent.TapPolicy) string) string {
	t.Helper()
	list, _, err := store.ListJSON[intent.TapPolicy](t.Context(), s, intent.TapsPrefix)
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(list, func(a, b intent.TapPolicy) int { return strings.Compare(a.Name, b.Name) })
	var out []string
	for _, p := range list {
		out = append(out, format(p))
	}
	return strings.Join(out, " ")
}

func TestTopologyTapsAreSeededThroughTheAPIsChecks(t *testing.T) {
	file := tapTopo + `taps:
  - {name: web, sender: blue/web/web1, receiver: any, monitor: blue/ops/mon, proto: tcp, dport: 80}
  - {name: by-addr, sender: 10.1.1.3, receiver: blue/db, monitor: "02:00:0a:01:03:02", both_directions: true}
`
	c, s := newController()
	if err := c.ApplyTopology(t.Context(), parse(t, file)); err != nil {
		t.Fatal(err)
	}
	// The IP and MAC resolve to the VMs the file has just been given.
	want := "by-addr#2=blue/web/web2>blue/db@blue/ops/mon web#1=blue/web/web1>any@blue/ops/mon"
	if got := storedTaps(t, s); got != want {
		t.Fatalf("seeded %s, want %s", got, want)
	}
	// Applied again without web and by-addr changed: by-addr keeps its id.
	file = tapTopo + `taps:
  - {name: by-addr, sender: blue/web, receiver: blue/db, monitor: blue/ops/mon}
`
	if err := c.ApplyTopology(t.Context(), parse(t, file)); err != nil {
		t.Fatal(err)
	}
	if got, want := storedTaps(t, s), "by-addr#2=blue/web>blue/db@blue/ops/mon"; got != want {
		t.Fatalf("re-applied %s, want %s", got, want)
	}

	cases := []struct {
		taps string
		want string
	}{
		// What only the controller knows: addresses, segment ids.
		{"  - name: a\n    sender: 10.1.1.99\n    receiver: any\n    monitor: blue/ops/mon\n", "t.yaml:22: tap a: sender: no VM has address 10.1.1.99"},
		{"  - name: a\n    sender: blue/web/web1\n    receiver: any\n    monitor: 10.2.1.3\n", "t.yaml:24: tap a: monitor: the monitor is in farm red and the sender in farm blue"},
		{"  - name: a\n    sender: any\n    receiver: any\n    monitor: blue/ops/mon\n    vlan: 1000\n", "t.yaml:25: tap a: vlan: vlan 1000 is farm id 3 subnet id 232"},
		{"  - {name: a, sender: any, receiver: any, monitor: blue/ops/mon}\n  - {name: b, sender: any, receiver: any, monitor: 10.1.3.2}\n", "t.yaml:22: tap b: body: tap a copies the same traffic"},
	}
	for _, tc := range cases {
		c, _ := newController()
		err := c.ApplyTopology(t.Context(), parse(t, tapTopo+"taps:\n"+tc.taps))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v\nwant %q", tc.taps, err, tc.want)
		}
	}
}

// A file's collector is checked as the API checks one, against the fabric
// the file gives its hosts: the store it seeds has no node record yet.
func TestTopologyTapsToACollectorAreCheckedAgainstTheFilesFabric(t *testing.T) {
	file := tapTopo + `taps:
  - {name: col, sender: blue/web, receiver: any, collector: 192.168.100.200}
  - {name: col-addr, sender: 10.1.1.3, receiver: blue/db, collector: 192.168.100.201, encap: gre}
`
	c, s := newController()
	if err := c.ApplyTopology(t.Context(), parse(t, file)); err != nil {
		t.Fatal(err)
	}
	if nodes, _, err := s.List(t.Context(), intent.NodesPrefix); err != nil || len(nodes) != 0 {
		t.Fatalf("node records %v %v: the test wants none", nodes, err)
	}
	got := storedTapsAs(t, s, func(p intent.TapPolicy) string {
		return fmt.Sprintf("%s=%s>%s@%q,%s:%s", p.Name, p.Sender, p.Receiver, p.Monitor, p.Collector, p.Encap)
	})
	// The encapsulation defaults as through the API; an IP resolves.
	want := `col=blue/web>any@"",192.168.100.200:erspan2 col-addr=blue/web/web2>blue/db@"",192.168.100.201:gre`
	if got != want {
		t.Fatalf("seeded %s, want %s", got, want)
	}

	// What only the controller knows: a host's later uplink, an end's farm
	// by its address.
	twoUplinks := strings.Replace(tapTopo, "{name: h1}", "{name: h1, uplinks: 2}", 1)
	up1 := parse(t, twoUplinks).Hosts[0].UplinkAddrs[1]
	cases := []struct {
		topo, taps string
		want       string
	}{
		{twoUplinks, "  - name: a\n    sender: blue/web\n    receiver: any\n    collector: " + up1 + "\n", "t.yaml:24: tap a: collector: " + up1 + " is host h1's own address"},
		{tapTopo, "  - name: a\n    sender: 10.1.1.3\n    receiver: red/app\n    collector: 192.168.100.200\n", "t.yaml:23: tap a: receiver: the sender is in farm blue and the receiver in farm red"},
	}
	for _, tc := range cases {
		c, _ := newController()
		err := c.ApplyTopology(t.Context(), parse(t, tc.topo+"taps:\n"+tc.taps))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v\nwant %q", tc.taps, err, tc.want)
		}
	}
}
