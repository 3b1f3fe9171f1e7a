package vnat

import (
	"net/netip"
	"strings"
	"testing"
)

func TestEntriesTranslateEachEndsMove(t *testing.T) {
	v := Virtual{TCP, ap("10.1.1.2:40000"), ap("10.2.2.2:80")}
	p := Physical{TCP, ap("10.3.3.3:40001"), ap("10.4.4.4:80")}
	e, err := Entries(v, p)
	if err != nil {
		t.Fatal(err)
	}
	if got := TupleOfKey(e[0].Key); got != Tuple(v) || e[0].Key.Dir != Egress {
		t.Errorf("egress key %s dir %d, want %s", got, e[0].Key.Dir, v)
	}
	if got := (Tuple{Proto: TCP, Local: netip.AddrPortFrom(addrOf(e[0].Value.Saddr), portOf(e[0].Value.Sport)),
		Remote: netip.AddrPortFrom(addrOf(e[0].Value.Daddr), portOf(e[0].Value.Dport))}); got != Tuple(p) {
		t.Errorf("egress rewrite %s, want %s", got, p)
	}
	if got := TupleOfKey(e[1].Key); got != Tuple(p).Reverse() || e[1].Key.Dir != Ingress {
		t.Errorf("ingress key %s, want %s", got, Tuple(p).Reverse())
	}
	if got := (Tuple{Proto: TCP, Local: netip.AddrPortFrom(addrOf(e[1].Value.Saddr), portOf(e[1].Value.Sport)),
		Remote: netip.AddrPortFrom(addrOf(e[1].Value.Daddr), portOf(e[1].Value.Dport))}); got != Tuple(v).Reverse() {
		t.Errorf("ingress rewrite %s, want %s", got, Tuple(v).Reverse())
	}
	// Network byte order in memory, as the C's __be32/__be16 read it.
	if e[0].Key.Saddr != 0x0201010a || e[0].Key.Sport != 0x409c {
		t.Errorf("key saddr %#x sport %#x: not network byte order", e[0].Key.Saddr, e[0].Key.Sport)
	}
}

func TestEntriesRejectBadTuplesNamingTheField(t *testing.T) {
	ok := Virtual{UDP, ap("10.1.1.2:4000"), ap("10.2.2.2:53")}
	for _, c := range []struct {
		v    Virtual
		p    Physical
		want string
	}{
		{Virtual{Proto: 1, Local: ok.Local, Remote: ok.Remote}, Physical(ok), "protocol must be tcp or udp"},
		{Virtual{UDP, ap("[fe80::1]:4000"), ok.Remote}, Physical(ok), "local address fe80::1 is not IPv4"},
		{Virtual{UDP, ok.Local, ap("10.2.2.2:0")}, Physical(ok), "remote port is 0"},
		{ok, Physical{UDP, ap("0.0.0.0:1"), ok.Remote}, "physical: tuple udp 0.0.0.0:1->10.2.2.2:53: local address 0.0.0.0 is not a unicast"},
		{ok, Physical{UDP, ok.Local, ap("224.0.0.1:53")}, "not a unicast"},
		{ok, Physical{TCP, ok.Local, ap("10.9.9.9:53")}, "differ in protocol"},
		{ok, Physical(ok), "nothing to translate"},
	} {
		if _, err := Entries(c.v, c.p); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Entries(%s, %s) = %v, want an error with %q", c.v, c.p, err, c.want)
		}
	}
}

func TestTableRefusesTwoConnectionsOnOnePhysicalTuple(t *testing.T) {
	tb := NewTable()
	p := Physical{TCP, ap("10.3.3.3:40000"), ap("10.2.2.2:80")}
	if _, _, err := tb.Set(Virtual{TCP, ap("10.1.1.2:40000"), ap("10.2.2.2:80")}, p); err != nil {
		t.Fatal(err)
	}
	_, _, err := tb.Set(Virtual{TCP, ap("10.1.1.9:40000"), ap("10.2.2.2:80")}, p)
	if err == nil || !strings.Contains(err.Error(), "already connection") {
		t.Fatalf("second connection on %s: %v", p, err)
	}
}

func TestTableMoveLeavesOldIngressEntryStaleAndForgetRemovesBoth(t *testing.T) {
	tb := NewTable()
	v := Virtual{UDP, ap("10.1.1.2:5000"), ap("10.2.2.2:53")}
	p1 := Physical{UDP, ap("10.3.3.3:5000"), ap("10.2.2.2:53")}
	p2 := Physical{UDP, ap("10.5.5.5:5000"), ap("10.2.2.2:53")}
	if _, stale, err := tb.Set(v, p1); err != nil || len(stale) != 0 {
		t.Fatalf("first set: stale %v err %v", stale, err)
	}
	_, stale, err := tb.Set(v, p2)
	if err != nil {
		t.Fatal(err)
	}
	if len(stale) != 1 || TupleOfKey(stale[0].Key) != Tuple(p1).Reverse() {
		t.Fatalf("stale %+v, want p1's ingress key", stale)
	}
	// p1 is free again for another connection.
	if _, _, err := tb.Set(Virtual{UDP, ap("10.1.1.7:5000"), ap("10.2.2.2:53")}, p1); err != nil {
		t.Fatal(err)
	}
	if got := tb.Forget(v); len(got) != 2 || tb.Len() != 1 {
		t.Errorf("forget: %d entries, %d left", len(got), tb.Len())
	}
	if got := tb.Forget(v); got != nil {
		t.Errorf("forgetting twice gave %v", got)
	}
}

func TestRemoteRoutesOnlyForMovedPeers(t *testing.T) {
	tb := NewTable()
	must := func(v Virtual, p Physical) {
		t.Helper()
		if _, _, err := tb.Set(v, p); err != nil {
			t.Fatal(err)
		}
	}
	must(Virtual{TCP, ap("10.1.1.2:1"), ap("10.2.2.2:80")}, Physical{TCP, ap("10.3.3.3:1"), ap("10.2.2.2:80")}) // only local moved
	must(Virtual{TCP, ap("10.1.1.2:2"), ap("10.6.6.6:80")}, Physical{TCP, ap("10.1.1.2:2"), ap("10.7.7.7:80")})
	must(Virtual{UDP, ap("10.1.1.2:3"), ap("10.6.6.6:53")}, Physical{UDP, ap("10.1.1.2:3"), ap("10.7.7.7:53")})
	r := tb.RemoteRoutes()
	if len(r) != 1 || r[netip.MustParseAddr("10.6.6.6")] != netip.MustParseAddr("10.7.7.7") {
		t.Errorf("routes %v, want only 10.6.6.6 -> 10.7.7.7", r)
	}
	_, _, err := tb.Set(Virtual{TCP, ap("10.1.1.2:4"), ap("10.6.6.6:22")}, Physical{TCP, ap("10.1.1.2:4"), ap("10.8.8.8:22")})
	if err == nil || !strings.Contains(err.Error(), "already at 10.7.7.7") {
		t.Errorf("one virtual peer at two physical places: %v", err)
	}
	// Moving every connection of that peer is fine, one at a time.
	must(Virtual{TCP, ap("10.1.1.2:2"), ap("10.6.6.6:80")}, Physical{TCP, ap("10.1.1.2:2"), ap("10.7.7.7:80")})
	tb.Forget(Virtual{UDP, ap("10.1.1.2:3"), ap("10.6.6.6:53")})
	must(Virtual{TCP, ap("10.1.1.2:2"), ap("10.6.6.6:80")}, Physical{TCP, ap("10.1.1.2:2"), ap("10.8.8.8:80")})
	if r := tb.RemoteRoutes(); r[netip.MustParseAddr("10.6.6.6")] != netip.MustParseAddr("10.8.8.8") || len(r) != 1 {
		t.Errorf("after the peer moved again: %v", r)
	}
	tb.Forget(Virtual{TCP, ap("10.1.1.2:2"), ap("10.6.6.6:80")})
	if r := tb.RemoteRoutes(); len(r) != 0 {
		t.Errorf("routes left after forgetting: %v", r)
	}
}
