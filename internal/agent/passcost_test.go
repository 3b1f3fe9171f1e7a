package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/policy"
	"github.com/onehop/onehop/internal/store"
)

// passHost is an agent whose host carries n VMs (each vif present), ready
// to take one more VM's key as its watch would hand it over.
type passHost struct {
	a   *Agent
	ifs fakeInterfaces
	n   int
}

func newPassHost(tb testing.TB, n int) *passHost {
	tb.Helper()
	ifs := fakeInterfaces{"uplink0": 2}
	a, err := New(Config{Node: "h1", Uplink: "uplink0"}, store.NewMemory(), &fakeDatapath{}, ifs, quiet())
	if err != nil {
		tb.Fatal(err)
	}
	h := &passHost{a: a, ifs: ifs}
	for range n {
		h.add(tb)
	}
	if _, err := a.pass(context.Background(), "list", n); err != nil {
		tb.Fatal(err)
	}
	return h
}

// vmOn is the host's i-th VM's desired key and value.
func vmOn(tb testing.TB, i int) (string, intent.LocalEndpoint) {
	tb.Helper()
	vm := intent.NewVM("blue", fmt.Sprint("s", i/250), fmt.Sprint("vm", i), "h1", netip.AddrFrom4([4]byte{10, 1, byte(i / 250), byte(2 + i%250)}))
	return intent.DesiredVMKey("h1", vm.FullName()), policy.LocalEndpoint(vm)
}

// add puts one more VM (the host's n-th) in the agent's view and its vif
// on the host, as a create does; the next pass applies it.
func (h *passHost) add(tb testing.TB) {
	tb.Helper()
	key, l := vmOn(tb, h.n)
	h.ifs[l.Interface] = 10 + h.n
	h.n++
	a := h.a
	a.passMu.Lock()
	defer a.passMu.Unlock()
	if err := a.view.Set(key, mustJSONBytes(tb, l)); err != nil {
		tb.Fatal(err)
	}
}

// drop takes the last VM added away again (a delete) and applies it.
func (h *passHost) drop(tb testing.TB) {
	tb.Helper()
	h.n--
	key, l := vmOn(tb, h.n)
	delete(h.ifs, l.Interface)
	h.a.passMu.Lock()
	h.a.view.Delete(key)
	h.a.passMu.Unlock()
	if _, err := h.a.pass(context.Background(), "change", 1); err != nil {
		tb.Fatal(err)
	}
}

func mustJSONBytes(tb testing.TB, l intent.LocalEndpoint) []byte {
	tb.Helper()
	b, err := json.Marshal(l)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// createPass is what one create costs the agent of its host: the pass
// that applies one more VM's key.
func (h *passHost) createPass(tb testing.TB) time.Duration {
	h.add(tb)
	start := time.Now()
	if _, err := h.a.pass(context.Background(), "change", 1); err != nil {
		tb.Fatal(err)
	}
	took := time.Since(start)
	h.drop(tb) // off the clock: the host keeps its n VMs
	return took
}

// BenchmarkCreatePassWithNOnHost is the agent's part of a create (issue 20,
// item 18): the pass that applies one more VM, on a host carrying 100 VMs
// and on one carrying 2,000, interleaved in one run so that both see the
// same machine. It reports each and their ratio (x2000/100): a pass whose
// cost grows with the VMs a host already carries slows every create as
// hosts fill. make unit-test runs it once (-benchtime 1x); for figures:
//
//	go test -run '^$' -bench CreatePassWithNOnHost -benchtime 300x ./internal/agent/
func BenchmarkCreatePassWithNOnHost(b *testing.B) {
	few, many := newPassHost(b, 100), newPassHost(b, 2000)
	var tFew, tMany time.Duration
	b.ResetTimer()
	for b.Loop() {
		tFew += few.createPass(b)
		tMany += many.createPass(b)
	}
	perFew, perMany := tFew/time.Duration(b.N), tMany/time.Duration(b.N)
	b.ReportMetric(float64(perFew.Nanoseconds()), "ns/pass@100")
	b.ReportMetric(float64(perMany.Nanoseconds()), "ns/pass@2000")
	b.ReportMetric(float64(perMany)/float64(perFew), "x2000/100")
}
