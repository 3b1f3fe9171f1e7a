package controller

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/desired"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/policy"
	"github.com/onehop/onehop/internal/store"
)

// cloud fills a memory store through the controller's own operations:
// farms blue and red (peered), subnets s0..s{subnets-1} in each, hosts
// h0..h{hosts-1} and vms VMs spread over all of them.
func cloud(t testing.TB, hosts, subnets, vms int) (*Controller, *store.Memory) {
	t.Helper()
	s := store.NewMemory()
	return cloudOn(t, s, hosts, subnets, vms), s
}

// cloudOn is cloud on the store s.
func cloudOn(t testing.TB, s store.Store, hosts, subnets, vms int) *Controller {
	t.Helper()
	ctx := context.Background()
	for i := range hosts {
		if err := store.PutJSON(ctx, s, intent.HostsPrefix+fmt.Sprint("h", i), intent.Host{Name: fmt.Sprint("h", i)}); err != nil {
			t.Fatal(err)
		}
	}
	c := New(s, slog.New(slog.DiscardHandler))
	for _, f := range []string{"blue", "red"} {
		if _, err := c.CreateFarm(ctx, f, f == "red"); err != nil {
			t.Fatal(err)
		}
		for i := range subnets {
			if _, err := c.CreateSubnet(ctx, f, fmt.Sprint("s", i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, p := range [][2]string{{"blue", "red"}, {"red", "blue"}} {
		if _, err := c.Peer(ctx, p[0], p[1]); err != nil {
			t.Fatal(err)
		}
	}
	for i := range vms {
		farm := []string{"blue", "red"}[i%2]
		if _, err := c.CreateVM(ctx, farm, fmt.Sprint("s", (i/2)%subnets), fmt.Sprint("vm", i), fmt.Sprint("h", i%hosts)); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// written runs f and returns how many keys it wrote (put or deleted), by
// kind: intent, desired, farm state.
func written(t *testing.T, s *store.Memory, f func() error) map[string]int {
	t.Helper()
	before := s.Rev()
	events := s.WatchEvents(t.Context(), intent.Root, before)
	if err := f(); err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for got := int64(0); got < s.Rev()-before; {
		b := <-events
		if b.Err != nil {
			t.Fatal(b.Err)
		}
		for _, e := range b.Events {
			got++
			switch {
			case strings.HasPrefix(e.Key, intent.DesiredPrefix):
				out["desired"]++
			case strings.HasPrefix(e.Key, intent.FarmStatePrefix):
				out["farmstate"]++
			default:
				out["intent"]++
			}
		}
	}
	return out
}

// sameAsReference checks that the desired keys the controller wrote, read
// back per host, are what the reference compiler makes of the whole
// intent: the incremental compile misses nothing and leaves nothing stale.
func sameAsReference(t *testing.T, s *store.Memory) {
	t.Helper()
	ctx := t.Context()
	hosts, _, err := store.ListJSON[intent.Host](ctx, s, intent.HostsPrefix)
	if err != nil {
		t.Fatal(err)
	}
	farms, _, _ := store.ListJSON[intent.Farm](ctx, s, intent.FarmsPrefix)
	subnets, _, _ := store.ListJSON[intent.Subnet](ctx, s, intent.SubnetsPrefix)
	vms, _, _ := store.ListJSON[intent.VM](ctx, s, intent.VMsPrefix)
	slivers, _, _ := store.ListJSON[intent.Sliver](ctx, s, intent.SliversPrefix)
	taps, _, _ := store.ListJSON[intent.TapPolicy](ctx, s, intent.TapsPrefix)
	want, _ := policy.Compile(policy.State{Hosts: hosts, Farms: farms, Subnets: subnets, VMs: vms, Slivers: slivers, Taps: taps})
	for _, h := range hosts {
		got, _, err := desired.Read(ctx, s, h.Name)
		if err != nil {
			t.Fatal(err)
		}
		if got.Digest() != want[h.Name].Digest() {
			t.Fatalf("%s: desired state in the store\n%+v\nwant (reference compile)\n%+v", h.Name, got, want[h.Name])
		}
	}
	all, _, _ := s.List(ctx, intent.DesiredPrefix)
	n := 0
	for _, d := range want {
		n += len(d.Local) + len(d.Slivers) + len(d.Taps)
	}
	if len(all) != n {
		t.Fatalf("%d desired keys in the store, want %d (one per VM, sliver and TAP rule of a host)", len(all), n)
	}
}

// A change writes the keys it concerns, whatever the cloud's size: the
// same handful with 200 VMs and with 2,000 (before, every change rewrote
// the whole desired state of every host it touched, and the allocation
// record held every VM).
func TestAChangeWritesABoundedNumberOfKeysWhateverTheCloudsSize(t *testing.T) {
	for _, n := range []int{200, 2000} {
		t.Run(fmt.Sprint(n, "VMs"), func(t *testing.T) {
			c, s := cloud(t, 40, 8, n)
			ctx := t.Context()
			sameAsReference(t, s)
			checks := []struct {
				what string
				f    func() error
				max  map[string]int
			}{
				{"create a VM", func() error { _, err := c.CreateVM(ctx, "blue", "s1", "extra", "h3"); return err },
					map[string]int{"intent": 2, "desired": 1}},
				{"move it to another host", func() error { _, err := c.MoveVM(ctx, "blue", "s1", "extra", "h4", ""); return err },
					map[string]int{"intent": 1, "desired": 2}},
				{"move it to another subnet", func() error { _, err := c.MoveVM(ctx, "blue", "s1", "extra", "h4", "blue/s2"); return err },
					map[string]int{"intent": 4, "desired": 2}},
				{"add a rule", func() error {
					_, err := c.Allow(ctx, "blue", intent.Rule{From: "blue/s0", To: "blue/s1", Proto: "tcp", Port: 80})
					return err
				}, map[string]int{"intent": 1, "farmstate": 1}},
				{"add a rule across peered farms", func() error {
					if _, err := c.Allow(ctx, "blue", intent.Rule{From: "blue/s0", To: "red/s1", Proto: "tcp", Port: 443}); err != nil {
						return err
					}
					_, err := c.Allow(ctx, "red", intent.Rule{From: "blue/s0", To: "red/s1", Proto: "tcp", Port: 443})
					return err
				}, map[string]int{"intent": 2, "farmstate": 2}},
				{"delete the VM", func() error { return c.DeleteVM(ctx, "blue", "s2", "extra") },
					map[string]int{"intent": 2, "desired": 1}},
				{"create a subnet", func() error { _, err := c.CreateSubnet(ctx, "blue", "spare"); return err },
					map[string]int{"intent": 2, "farmstate": 1}},
				{"delete the empty subnet", func() error { return c.DeleteSubnet(ctx, "blue", "spare", false) },
					map[string]int{"intent": 2, "farmstate": 1}},
				{"create a farm", func() error { _, err := c.CreateFarm(ctx, "spare", false); return err },
					map[string]int{"intent": 2, "farmstate": 1}},
				// The record, the allocation, and the revocation of its
				// tenant's certificates (api_certs.go).
				{"delete the empty farm", func() error { return c.DeleteFarm(ctx, "spare", false) },
					map[string]int{"intent": 3, "farmstate": 1}},
			}
			for _, ch := range checks {
				got := written(t, s, ch.f)
				for kind, n := range got {
					if n > ch.max[kind] {
						t.Errorf("%s wrote %d %s keys, want at most %d (all: %v)", ch.what, n, kind, ch.max[kind], got)
					}
				}
				sameAsReference(t, s)
			}
		})
	}
}

// A restarted controller compiles in full and finds the store agrees: it
// writes nothing, so agents see no change at all.
func TestARestartedControllerWritesNothingWhenTheStoreAgrees(t *testing.T) {
	_, s := cloud(t, 10, 4, 300)
	c2 := New(s, slog.New(slog.DiscardHandler))
	got := written(t, s, func() error { _, err := c2.CompileOnce(t.Context()); return err })
	if len(got) != 0 {
		t.Fatalf("a full compile over an agreeing store wrote %v", got)
	}
}

// A store written by the one-value-per-host layout of before is moved to
// the keyed one by the first full compile, and the VM ids kept in the one
// allocation record move to one key per subnet on the first save.
func TestTheLayoutOfBeforeIsMigrated(t *testing.T) {
	ctx := t.Context()
	_, s := cloud(t, 3, 2, 20)
	// Rebuild the old layout: every VM id in intent.AllocKey, one
	// desired value per host.
	c0 := New(s, slog.New(slog.DiscardHandler))
	a, err := c0.alloc(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.PutJSON(ctx, s, intent.AllocKey, a); err != nil {
		t.Fatal(err)
	}
	ids, _, _ := s.List(ctx, intent.VMIDsPrefix)
	for k := range ids {
		s.Delete(ctx, k)
	}
	keys, _, _ := s.List(ctx, intent.DesiredPrefix)
	for k := range keys {
		s.Delete(ctx, k)
	}
	store.PutJSON(ctx, s, intent.DesiredPrefix+"h0", intent.Desired{Node: "h0"})

	c := New(s, slog.New(slog.DiscardHandler))
	if _, err := c.CompileOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, intent.DesiredPrefix+"h0"); err == nil {
		t.Fatal("the old one-value desired state of h0 is still there")
	}
	sameAsReference(t, s)
	v, err := c.CreateVM(ctx, "blue", "s0", "late", "h1")
	if err != nil {
		t.Fatal(err)
	}
	if v.IP != "10.1.1.7" {
		t.Fatalf("late got %s, want 10.1.1.7 (the ids of before kept)", v.IP)
	}
	after, err := New(s, slog.New(slog.DiscardHandler)).alloc(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(after.VMs) != 21 {
		t.Fatalf("%d VM ids after the migration, want 21: %v", len(after.VMs), after.VMs)
	}
	var top map[string]any
	if err := store.GetJSON(ctx, s, intent.AllocKey, &top); err != nil {
		t.Fatal(err)
	}
	if top["vms"] != nil {
		t.Fatalf("intent.AllocKey still holds VM ids: %v", top["vms"])
	}
}

// BenchmarkCreateVMEtcd is BenchmarkCreateVM against an embedded etcd
// (without fsync: the figure is the controller's, not the disk's).
func BenchmarkCreateVMEtcd(b *testing.B) {
	for _, n := range []int{1000, 5000} {
		b.Run(fmt.Sprint(n, "VMs"), func(b *testing.B) {
			c := cloudOn(b, embeddedStore(b, EtcdOptions{NoFsync: true}), 100, 40, n)
			benchCreates(b, c)
		})
	}
}

// BenchmarkCreateVM measures one VM create (validation, allocation, intent
// and desired writes) with the memory store, at a cloud of 1,000 and 5,000
// VMs: the figures should be alike (issue 12). The VMs go to subnets of a
// farm of their own, so that both runs allocate in equally full subnets (a
// create rewrites its subnet's VM ids: up to 253). Run with
// go test -run '^$' -bench CreateVM ./internal/controller/
func BenchmarkCreateVM(b *testing.B) {
	for _, n := range []int{1000, 5000} {
		b.Run(fmt.Sprint(n, "VMs"), func(b *testing.B) {
			c, _ := cloud(b, 100, 40, n)
			benchCreates(b, c)
		})
	}
}

// benchCreates creates (and, off the clock, deletes) VMs in a farm of their
// own.
func benchCreates(b *testing.B, c *Controller) {
	ctx := context.Background()
	if _, err := c.CreateFarm(ctx, "green", false); err != nil {
		b.Fatal(err)
	}
	for i := range 20 {
		if _, err := c.CreateSubnet(ctx, "green", fmt.Sprint("s", 20+i)); err != nil {
			b.Fatal(err)
		}
	}
	i := 0
	for b.Loop() {
		name := fmt.Sprint("bench", i)
		if _, err := c.CreateVM(ctx, "green", fmt.Sprint("s", 20+i%20), name, fmt.Sprint("h", i%100)); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := c.DeleteVM(ctx, "green", fmt.Sprint("s", 20+i%20), name); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		i++
	}
}

// A host an operator puts in the store behind the controller's back is
// taken in when an operation reads it: a VM placed there gets its desired
// key at once, not at the next full compile.
func TestAHostWrittenBehindTheControllerGetsItsVMsAtOnce(t *testing.T) {
	c, s := cloud(t, 2, 1, 4)
	ctx := t.Context()
	if err := store.PutJSON(ctx, s, intent.HostsPrefix+"late", intent.Host{Name: "late"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateVM(ctx, "blue", "s0", "onlate", "late"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, intent.DesiredVMKey("late", "blue/s0/onlate")); err != nil {
		t.Fatalf("the VM on a host written behind the controller has no desired key: %v", err)
	}
	sameAsReference(t, s)
}

// With TAP policies, the rules a host plays a part in follow its VMs: a VM
// of the sender subnet arriving on a host gives it the rule, the last one
// leaving takes it away, and a VM the policy names moving takes the
// monitor's edge with it. What is written always equals the reference.
func TestTapRulesFollowTheVMsTheyConcern(t *testing.T) {
	c, s := cloud(t, 6, 2, 24)
	ctx := t.Context()
	if _, err := c.CreateVM(ctx, "blue", "s1", "mon", "h5"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CreateTap(ctx, intent.TapPolicy{Name: "t1", Sender: "blue/s0", Receiver: "any", Monitor: "blue/s1/mon"}); err != nil {
		t.Fatal(err)
	}
	sameAsReference(t, s)
	tapKeys := func() int {
		all, _, _ := s.List(ctx, intent.DesiredPrefix)
		n := 0
		for k := range all {
			if _, kind, _, _ := intent.ParseDesiredKey(k); kind == intent.DesiredTapKind {
				n++
			}
		}
		return n
	}
	if tapKeys() == 0 {
		t.Fatal("the policy made no TAP key: the test shows nothing")
	}
	for _, step := range []func() error{
		func() error { _, err := c.CreateVM(ctx, "blue", "s0", "newsnd", "h1"); return err },
		func() error { _, err := c.MoveVM(ctx, "blue", "s0", "newsnd", "h3", ""); return err },
		func() error { _, err := c.MoveVM(ctx, "blue", "s1", "mon", "h2", ""); return err },
		func() error { return c.DeleteVM(ctx, "blue", "s0", "newsnd") },
		func() error { return c.DeleteTap(ctx, "t1") },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
		sameAsReference(t, s)
	}
	if n := tapKeys(); n != 0 {
		t.Fatalf("%d TAP keys left after the policy was deleted", n)
	}
}

// BenchmarkCreateVMWithNOnHost is the controller's part of a create as
// hosts fill (issue 20, item 18): creates onto three hosts carrying 100
// VMs each, then, in the same run against the same embedded etcd (without
// fsync), onto the same hosts carrying 2,000 each. It reports each and
// their ratio (x2000/100), which should be about 1: a check or listing
// that grows with a host's VMs (the interface-in-use check scanned them
// all) shows here. make unit-test runs it once (-benchtime 1x); figures:
//
//	go test -run '^$' -bench CreateVMWithNOnHost -benchtime 300x ./internal/controller/
func BenchmarkCreateVMWithNOnHost(b *testing.B) {
	const hosts = 3
	s := embeddedStore(b, EtcdOptions{NoFsync: true})
	c := cloudOn(b, s, hosts, 16, 100*hosts)
	ctx := context.Background()
	if _, err := c.CreateFarm(ctx, "green", false); err != nil {
		b.Fatal(err)
	}
	for i := range hosts {
		if _, err := c.CreateSubnet(ctx, "green", fmt.Sprint("g", i)); err != nil {
			b.Fatal(err)
		}
	}
	// One create (timed) and its delete (not) on each host in turn, in
	// a subnet of its own: the figure is the host's, not a subnet's.
	i := 0
	create := func() time.Duration {
		host, sub, name := fmt.Sprint("h", i%hosts), fmt.Sprint("g", i%hosts), fmt.Sprint("bench", i)
		i++
		start := time.Now()
		if _, err := c.CreateVM(ctx, "green", sub, name, host); err != nil {
			b.Fatal(err)
		}
		took := time.Since(start)
		if err := c.DeleteVM(ctx, "green", sub, name); err != nil {
			b.Fatal(err)
		}
		return took
	}
	var few, many time.Duration
	n := 0
	for b.Loop() {
		few += create()
		n++
	}
	// The hosts filled to 2,000 VMs each, off the clock, then as many
	// creates again.
	b.StopTimer()
	for j := 100 * hosts; j < 2000*hosts; j++ {
		farm := []string{"blue", "red"}[j%2]
		if _, err := c.CreateVM(ctx, farm, fmt.Sprint("s", (j/2)%16), fmt.Sprint("vm", j), fmt.Sprint("h", j%hosts)); err != nil {
			b.Fatal(err)
		}
	}
	for range n {
		many += create()
	}
	b.ReportMetric(float64(few.Nanoseconds())/float64(n), "ns/create@100")
	b.ReportMetric(float64(many.Nanoseconds())/float64(n), "ns/create@2000")
	b.ReportMetric(float64(many)/float64(few), "x2000/100")
}
