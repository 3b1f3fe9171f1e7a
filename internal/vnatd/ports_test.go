package vnatd

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/onehop/onehop/internal/vcmp"
)

// portsTr is a datapath that knows the sockets at the new address and
// hands out ports from 50000 on (UDP from 51000).
type portsTr struct {
	*fakeTr
	socks    []Socket
	next     uint16
	held     map[vcmp.Tuple]uint16
	released []vcmp.Tuple
}

func (p *portsTr) SocketsAt(addr netip.Addr) ([]Socket, error) {
	var out []Socket
	for _, s := range p.socks {
		if s.Local.Addr() == addr || s.Local.Addr().IsUnspecified() {
			out = append(out, s)
		}
	}
	return out, nil
}

func (p *portsTr) Reserve(v vcmp.Tuple, _ netip.Addr) (uint16, error) {
	p.next++
	p.held[v] = 50000 + p.next - 1
	if v.Proto == vcmp.UDP {
		p.held[v] += 1000
	}
	return p.held[v], nil
}

func (p *portsTr) Hold(v vcmp.Tuple, at netip.AddrPort) error {
	p.held[v] = at.Port()
	return nil
}

func (p *portsTr) Release(v vcmp.Tuple) error {
	if _, ok := p.held[v]; ok {
		delete(p.held, v)
		p.released = append(p.released, v)
	}
	return nil
}

// A moved end whose port is taken at its new address travels from another
// (held for it), tells the peer in VNAT_UPD, and the peer translates to
// it; a port taken by nothing, or only by a listener, is kept.
func TestMovedEndTakesAnotherPortWhenItsOwnIsTakenAtTheNewAddress(t *testing.T) {
	n := newNetwork()
	a := n.add(t, "a", "10.0.1.1", Config{})
	b := n.add(t, "b", "10.0.2.2", Config{})
	pt := &portsTr{fakeTr: a.tr, held: map[vcmp.Tuple]uint16{}}
	a.e.tr = pt
	tTaken, bTaken := connect(a, b, 40000)   // a TCP socket at the new address has the same 4-tuple
	tFree, bFree := connect(a, b, 40001)     // nothing at the new address
	tListen, bListen := connect(a, b, 40003) // only a listener on the port there
	tUDP := vcmp.Tuple{Proto: vcmp.UDP, Local: ap("10.0.1.1:40002"), Remote: ap("10.0.2.2:53")}
	a.tr.open = append(a.tr.open, tUDP)
	b.tr.open = append(b.tr.open, tUDP.Reverse())
	keyAll(t, a, b)
	pt.socks = []Socket{
		{Proto: vcmp.TCP, Local: ap("10.0.3.3:40000"), Remote: ap("10.0.2.2:22")},
		{Proto: vcmp.UDP, Local: ap("0.0.0.0:40002")}, // unconnected: receives from anyone
		{Proto: vcmp.TCP, Local: ap("0.0.0.0:40003"), Listening: true},
		{Proto: vcmp.TCP, Local: ap("10.0.3.3:40001"), Remote: ap("10.0.2.2:23")}, // another peer port: no clash
	}
	old, new := n.move(a, "10.0.3.3")
	if err := a.e.Restore(t.Context(), old, new); err != nil {
		t.Fatal(err)
	}
	wantAt := func(nd *node, v vcmp.Tuple, want string) {
		t.Helper()
		p, ok := nd.tr.phys(v)
		if !ok || p.String() != want {
			t.Errorf("%s: %v translated to %v (%v), want %s", nd.name, v, p, ok, want)
		}
	}
	tcpPort, udpPort := pt.held[tTaken], pt.held[tUDP]
	if tcpPort < 50000 || tcpPort > 50001 || udpPort < 51000 || udpPort > 51001 {
		t.Fatalf("held ports %v: want one TCP and one UDP port reserved", pt.held)
	}
	wantAt(a, tTaken, fmt.Sprintf("tcp 10.0.3.3:%d->10.0.2.2:22", tcpPort))
	wantAt(b, bTaken, fmt.Sprintf("tcp 10.0.2.2:22->10.0.3.3:%d", tcpPort))
	wantAt(a, tUDP, fmt.Sprintf("udp 10.0.3.3:%d->10.0.2.2:53", udpPort))
	wantAt(b, tUDP.Reverse(), fmt.Sprintf("udp 10.0.2.2:53->10.0.3.3:%d", udpPort))
	wantAt(a, tFree, "tcp 10.0.3.3:40001->10.0.2.2:22")
	wantAt(b, bFree, "tcp 10.0.2.2:22->10.0.3.3:40001")
	wantAt(a, tListen, "tcp 10.0.3.3:40003->10.0.2.2:22")
	wantAt(b, bListen, "tcp 10.0.2.2:22->10.0.3.3:40003")
	if c := a.e.Counters(); c["ports_remapped"] != 2 {
		t.Errorf("a counters %v: want 2 ports remapped", c)
	}
	// Closed, the connection gives its port back.
	a.tr.close(tTaken)
	syncAll(t, a)
	if len(pt.released) != 1 || pt.released[0] != tTaken {
		t.Errorf("released %v after %v closed, want it", pt.released, tTaken)
	}
}

func TestPortTakenRules(t *testing.T) {
	phys := vcmp.Tuple{Proto: vcmp.TCP, Local: ap("10.0.3.3:40000"), Remote: ap("10.0.2.2:22")}
	for _, c := range []struct {
		name string
		s    Socket
		want bool
	}{
		{"same 4-tuple", Socket{Proto: vcmp.TCP, Local: phys.Local, Remote: phys.Remote}, true},
		{"other remote", Socket{Proto: vcmp.TCP, Local: phys.Local, Remote: ap("10.0.2.2:23")}, false},
		{"bound, not connected", Socket{Proto: vcmp.TCP, Local: phys.Local}, true},
		{"wildcard bound", Socket{Proto: vcmp.TCP, Local: ap("0.0.0.0:40000")}, true},
		{"listener", Socket{Proto: vcmp.TCP, Local: phys.Local, Listening: true}, false},
		{"udp on the port", Socket{Proto: vcmp.UDP, Local: phys.Local}, false},
		{"other address", Socket{Proto: vcmp.TCP, Local: ap("10.0.9.9:40000"), Remote: phys.Remote}, false},
		{"other port", Socket{Proto: vcmp.TCP, Local: ap("10.0.3.3:40001"), Remote: phys.Remote}, false},
	} {
		if got := portTaken(phys, []Socket{c.s}, nil); got != c.want {
			t.Errorf("%s: taken %v, want %v", c.name, got, c.want)
		}
	}
	if !portTaken(phys, nil, map[vcmp.Tuple]bool{phys: true}) {
		t.Error("a physical tuple another translation uses is not taken")
	}
}

// A daemon that takes over a translation from the pinned maps whose port
// differs from the virtual one holds that port again.
func TestTakenOverTranslationHoldsItsPortAgain(t *testing.T) {
	n := newNetwork()
	a := n.add(t, "a", "10.0.3.3", Config{})
	pt := &portsTr{fakeTr: a.tr, held: map[vcmp.Tuple]uint16{}}
	a.e.tr = pt
	v := vcmp.Tuple{Proto: vcmp.TCP, Local: ap("10.0.1.1:40000"), Remote: ap("10.0.2.2:22")}
	same := vcmp.Tuple{Proto: vcmp.TCP, Local: ap("10.0.1.1:40001"), Remote: ap("10.0.2.2:22")}
	a.tr.open = append(a.tr.open, v, same)
	a.tr.xlate[v] = vcmp.Tuple{Proto: vcmp.TCP, Local: ap("10.0.3.3:50007"), Remote: v.Remote}
	a.tr.xlate[same] = vcmp.Tuple{Proto: vcmp.TCP, Local: ap("10.0.3.3:40001"), Remote: same.Remote}
	syncAll(t, a)
	if len(pt.held) != 1 || pt.held[v] != 50007 {
		t.Errorf("held %v, want only %v's 50007", pt.held, v)
	}
	if s := state(t, a, v); s.State != "migrated" {
		t.Errorf("taken-over translation %+v, want migrated", s)
	}
}
