package controller

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/desired"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/topology"
)

const topo = `name: t
hosts: [{name: h1}, {name: h2}]
farms:
  - name: blue
    subnets: [{name: web}, {name: db}]
vms:
  - {name: web1, host: h1, subnet: blue/web}
  - {name: web2, host: h2, subnet: blue/web}
  - {name: db1, host: h2, subnet: blue/db}
`

func parse(t *testing.T, s string) *topology.File {
	t.Helper()
	f, err := topology.Parse("t.yaml", []byte(s))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func vms(t *testing.T, s store.Store) map[string]intent.VM {
	t.Helper()
	list, _, err := store.ListJSON[intent.VM](context.Background(), s, intent.VMsPrefix)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]intent.VM{}
	for _, v := range list {
		out[v.Name] = v
	}
	return out
}

func newController() (*Controller, *store.Memory) {
	s := store.NewMemory()
	return New(s, slog.New(slog.NewTextHandler(io.Discard, nil))), s
}

func TestTopologyBecomesIntentWithAllocatedAddresses(t *testing.T) {
	c, s := newController()
	if err := c.ApplyTopology(context.Background(), parse(t, topo)); err != nil {
		t.Fatal(err)
	}
	got := vms(t, s)
	want := map[string]string{"web1": "10.1.1.2", "web2": "10.1.1.3", "db1": "10.1.2.2"}
	for name, ip := range want {
		v := got[name]
		if v.IP != ip {
			t.Errorf("%s: ip %s, want %s", name, v.IP, ip)
		}
		if !strings.HasPrefix(v.MAC, "02:00:0a:") || v.Interface != intent.VifName("blue", name) {
			t.Errorf("%s: mac %s interface %s", name, v.MAC, v.Interface)
		}
	}
	if got["db1"].Gateway != "10.1.2.1" {
		t.Errorf("db1 gateway %s", got["db1"].Gateway)
	}
}

func TestReapplyingKeepsAddressesAndRemovesDroppedVMs(t *testing.T) {
	c, s := newController()
	ctx := context.Background()
	c.ApplyTopology(ctx, parse(t, topo))
	smaller := strings.Replace(topo, "  - {name: web1, host: h1, subnet: blue/web}\n", "", 1)
	if err := c.ApplyTopology(ctx, parse(t, smaller)); err != nil {
		t.Fatal(err)
	}
	got := vms(t, s)
	if _, ok := got["web1"]; ok {
		t.Error("web1 still in intent after it left the topology")
	}
	if got["web2"].IP != "10.1.1.3" {
		t.Errorf("web2 renumbered to %s", got["web2"].IP)
	}
	// The freed address is handed out again.
	again := smaller + "  - {name: web9, host: h1, subnet: blue/web}\n"
	c.ApplyTopology(ctx, parse(t, again))
	if ip := vms(t, s)["web9"].IP; ip != "10.1.1.2" {
		t.Errorf("web9 got %s, want the freed 10.1.1.2", ip)
	}
}

func TestDesiredStateHoldsOnlyTheHostsOwnVMs(t *testing.T) {
	c, s := newController()
	ctx := context.Background()
	c.ApplyTopology(ctx, parse(t, topo))
	store.PutJSON(ctx, s, intent.NodesPrefix+"h1", intent.Node{Name: "h1", UplinkMAC: "aa:00:00:00:00:01"})
	store.PutJSON(ctx, s, intent.NodesPrefix+"h2", intent.Node{Name: "h2", UplinkMAC: "aa:00:00:00:00:02"})
	if _, err := c.CompileOnce(ctx); err != nil {
		t.Fatal(err)
	}
	var d1, d2 intent.Desired
	d1, _, _ = desired.Read(ctx, s, "h1")
	d2, _, _ = desired.Read(ctx, s, "h2")
	// Other hosts' VMs are the ARP engine's to find, not the controller's
	// to push: each host's state grows with its own VMs only.
	if len(d1.Local) != 1 || d1.Local[0].Name != "blue/web/web1" {
		t.Fatalf("h1: %+v", d1.Local)
	}
	for _, l := range d2.Local {
		if l.Name == "blue/web/web1" {
			t.Fatalf("h2 holds h1's VM: %+v", d2.Local)
		}
	}
}

func TestDaemonConfigNeedsAStore(t *testing.T) {
	if err := (DaemonConfig{}).Validate(); err == nil || !strings.Contains(err.Error(), "--data-dir") {
		t.Fatalf("err = %v", err)
	}
	if err := (DaemonConfig{EtcdEndpoints: []string{"http://x:2379"}, Insecure: true}).Validate(); err != nil {
		t.Fatal(err)
	}
}
