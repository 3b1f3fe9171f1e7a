package vnatd

import (
	"net/netip"
	"testing"
)

// A mover behind a NAT (the paper's laptop) names its own, private,
// physical address in its update; its peer can reach it only at the NAT's
// address, which the update's stream came from. The control first: a
// move with no NAT is installed where the mover says (and where the
// update came from: the same). Then a moves behind a NAT: b installs the
// NAT's address with the port a names, counts it (updates_from_nat), and
// a is migrated. Before the fix b installed a's private address, where
// nothing it sends arrives.
func TestAMoverBehindANATIsTranslatedToWhereItsUpdateCameFrom(t *testing.T) {
	n := newNetwork()
	a := n.add(t, "a", "10.0.1.1", Config{})
	b := n.add(t, "b", "10.0.2.2", Config{})
	ta, tb := connect(a, b, 40000)
	keyAll(t, a, b)

	// The control: no NAT.
	old, mid := n.move(a, "10.0.3.3")
	if err := a.e.Restore(t.Context(), old, mid); err != nil {
		t.Fatal(err)
	}
	wantPhys(t, b, tb, b.addr, mid)
	wantPhys(t, a, ta, mid, b.addr)
	wantCounter(t, b, "updates_from_nat", 0)

	// Behind a NAT: a's streams come from 10.0.9.1.
	nat := netip.MustParseAddr("10.0.9.1")
	_, private := n.move(a, "192.168.7.2")
	n.mu.Lock()
	n.nat[private] = nat
	n.mu.Unlock()
	if err := a.e.Restore(t.Context(), mid, private); err != nil {
		t.Fatal(err)
	}
	if s := state(t, a, ta); s.State != "migrated" {
		t.Fatalf("a behind the NAT: %+v, want migrated\n%s", s, a.logs)
	}
	wantPhys(t, a, ta, private, b.addr)
	p, ok := b.tr.phys(tb)
	if want := netip.AddrPortFrom(nat, 40000); !ok || p.Remote != want {
		t.Fatalf("b translates %v to %v (%v), want its peer at %v (the NAT's address, a's port)\n%s", tb, p, ok, want, b.logs)
	}
	wantCounter(t, b, "updates_from_nat", 1)
	wantCounter(t, b, "updates_applied", 2)
}
