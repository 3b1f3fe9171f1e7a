// Package vnat is the kernel side of connection migration on an endpoint
// (paper §3–5): the translation table a migrated connection's packets are
// rewritten through, the record of the connections an endpoint has open,
// and the loader that attaches bpf/vnat.c to an interface and a cgroup.
// It runs on the endpoint (any Linux machine; in the lab a VM's
// namespace), not on an onehop host. This file and table.go are pure: no
// kernel calls, so they test without root.
package vnat

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"net/netip"

	"github.com/onehop/onehop/internal/vcmp"
)

// Proto is a transport protocol VNAT translates: VCMP's, so the daemon
// and the datapath name connections alike.
type Proto = vcmp.Proto

// The protocols VNAT translates (IANA numbers, as in the IP header).
const (
	TCP = vcmp.TCP
	UDP = vcmp.UDP
)

// Tuple is a connection seen from this end: its local and remote address
// and port (vcmp.Tuple: the same connection's tuple at the other end has
// Local and Remote swapped, Reverse).
type Tuple = vcmp.Tuple

// validate says what is wrong with t, if anything: VNAT handles IPv4 TCP
// and UDP with both ends' addresses and ports set.
func validate(t Tuple) error {
	if t.Proto != TCP && t.Proto != UDP {
		return fmt.Errorf("tuple %s: protocol must be tcp or udp", t)
	}
	for _, e := range []struct {
		what string
		ap   netip.AddrPort
	}{{"local", t.Local}, {"remote", t.Remote}} {
		a := e.ap.Addr()
		if !a.Is4() {
			return fmt.Errorf("tuple %s: %s address %s is not IPv4", t, e.what, a)
		}
		if a.IsUnspecified() || a.IsMulticast() || a == netip.AddrFrom4([4]byte{255, 255, 255, 255}) {
			return fmt.Errorf("tuple %s: %s address %s is not a unicast address", t, e.what, a)
		}
		if e.ap.Port() == 0 {
			return fmt.Errorf("tuple %s: %s port is 0", t, e.what)
		}
	}
	return nil
}

// Virtual is a connection's virtual tuple: the addresses and ports its
// sockets use, for its whole life (paper §3.1: the initial physical ones).
type Virtual Tuple

// Physical is where a connection's two ends are now: what goes on the wire.
type Physical Tuple

func (v Virtual) String() string  { return Tuple(v).String() }
func (p Physical) String() string { return Tuple(p).String() }

// compareTuples orders tuples by protocol, then local and remote address
// and port, numerically. Listings sort with it: a comparison that formats
// the tuples as text cost more than the rest of a 10,000-connection
// listing, and the daemon lists on every sync (issue 20 item 7).
func compareTuples(a, b Tuple) int {
	if c := cmp.Compare(a.Proto, b.Proto); c != 0 {
		return c
	}
	if c := a.Local.Compare(b.Local); c != 0 {
		return c
	}
	return a.Remote.Compare(b.Remote)
}

// be32 is an IPv4 address as the C side's __be32 reads it on a
// little-endian machine: the network-order bytes, loaded little-endian.
func be32(a netip.Addr) uint32 {
	b := a.As4()
	return binary.LittleEndian.Uint32(b[:])
}

// be16 is a port as the C side's __be16 reads it.
func be16(port uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], port)
	return binary.LittleEndian.Uint16(b[:])
}

func addrOf(be uint32) netip.Addr {
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], be)
	return netip.AddrFrom4(b)
}

func portOf(be uint16) uint16 {
	var b [2]byte
	binary.LittleEndian.PutUint16(b[:], be)
	return binary.BigEndian.Uint16(b[:])
}
