package lispdp

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"sort"
)

// Slots is how many hash slots an EID mapping's paths are spread over: a
// path with weight w of a total W gets about w/W of them (at least one).
const Slots = 32

// eidEntry is what SetEID writes for a prefix: the C struct lisp_eid.
func eidEntry(paths []PathChoice) (lispLispEid, error) {
	var e lispLispEid
	if len(paths) == 0 {
		e.Flags = uint8(lispLispEidFlagLISP_EID_NEGATIVE)
		return e, nil
	}
	if len(paths) > Slots {
		return e, fmt.Errorf("%d paths: at most %d", len(paths), Slots)
	}
	seen := map[uint8]bool{}
	best := -1
	for _, p := range paths {
		if seen[p.ID] {
			return e, fmt.Errorf("path %d listed twice", p.ID)
		}
		seen[p.ID] = true
		/* every path, whatever its priority: its remote RLOC may send
		   from the prefix (decapsulation checks the inner source) */
		e.Members[e.Nmembers] = p.ID
		e.Nmembers++
		if p.Priority == Unusable {
			continue
		}
		e.Usable[p.ID/64] |= 1 << (p.ID % 64)
		if best < 0 || int(p.Priority) < best {
			best = int(p.Priority)
		}
	}
	if best < 0 {
		return e, nil // every RLOC unusable: nslots 0, the datapath drops (no_path)
	}
	var top []PathChoice
	for _, p := range paths {
		if int(p.Priority) == best {
			top = append(top, p)
		}
	}
	sort.Slice(top, func(i, j int) bool { return top[i].ID < top[j].ID })
	n := apportion(top)
	i := 0
	for k, p := range top {
		for range n[k] {
			e.Slots[i] = p.ID
			i++
		}
	}
	e.Nslots = Slots
	return e, nil
}

// apportion shares Slots among the choices by weight (all weights 0: equal
// shares, RFC 9301 §5.4), each positive weight getting at least one slot,
// by largest remainder; the counts sum to Slots.
func apportion(top []PathChoice) []int {
	w := make([]int, len(top))
	total := 0
	for i, p := range top {
		w[i] = int(p.Weight)
		total += w[i]
	}
	if total == 0 {
		for i := range w {
			w[i] = 1
		}
		total = len(w)
	}
	n := make([]int, len(top))
	rem := make([]int, len(top))
	given := 0
	for i := range w {
		n[i] = w[i] * Slots / total
		rem[i] = w[i] * Slots % total
		if w[i] > 0 && n[i] == 0 {
			n[i], rem[i] = 1, 0
		}
		given += n[i]
	}
	for given < Slots {
		k := 0
		for i := range rem {
			if rem[i] > rem[k] || (rem[i] == rem[k] && w[i] > w[k]) {
				k = i
			}
		}
		n[k]++
		rem[k] = -1
		given++
	}
	for given > Slots { // minimums pushed past Slots: take back from the largest
		k := 0
		for i := range n {
			if n[i] > n[k] {
				k = i
			}
		}
		n[k]--
		given--
	}
	return n
}

// pathEntry is the C struct lisp_path for p, after checking p.
func pathEntry(p Path) (lispLispPath, error) {
	var e lispLispPath
	switch {
	case p.Ifindex <= 0:
		return e, fmt.Errorf("ifindex %d is no interface", p.Ifindex)
	case !p.LocalRLOC.Is4():
		return e, fmt.Errorf("local RLOC %v is not IPv4", p.LocalRLOC)
	case !p.RemoteRLOC.Is4():
		return e, fmt.Errorf("remote RLOC %v is not IPv4", p.RemoteRLOC)
	case len(p.DstMAC) != 0 && (len(p.SrcMAC) != 6 || len(p.DstMAC) != 6):
		return e, fmt.Errorf("MACs %v -> %v are not Ethernet addresses", p.SrcMAC, p.DstMAC)
	case p.InstanceID > 0xffffff:
		return e, fmt.Errorf("instance id %d does not fit 24 bits", p.InstanceID)
	case p.MTU < 68+Overhead || p.MTU > 0xffff:
		return e, fmt.Errorf("MTU %d outside %d..65535", p.MTU, 68+Overhead)
	}
	e.Ifindex = uint32(p.Ifindex)
	e.LocalRloc = be32(p.LocalRLOC)
	e.RemoteRloc = be32(p.RemoteRLOC)
	copy(e.SrcMac[:], p.SrcMAC)
	copy(e.DstMac[:], p.DstMAC)
	e.Mtu = uint16(p.MTU)
	e.Flags = uint8(lispLispPathFlagLISP_PATH_UP)
	if len(p.DstMAC) == 0 {
		e.Flags |= uint8(lispLispPathFlagLISP_PATH_NEIGH)
	}
	if p.UseInstanceID {
		e.Flags |= uint8(lispLispPathFlagLISP_PATH_IID)
		e.Iid = p.InstanceID
	}
	return e, nil
}

// be32 is an IPv4 address as the C's __be32 reads on this host.
func be32(a netip.Addr) uint32 {
	b := a.As4()
	return binary.NativeEndian.Uint32(b[:])
}

func eidKey(p netip.Prefix) (lispLispEidKey, error) {
	if !p.Addr().Is4() {
		return lispLispEidKey{}, fmt.Errorf("EID prefix %v is not IPv4", p)
	}
	p = p.Masked()
	return lispLispEidKey{Prefixlen: uint32(p.Bits()), Addr: be32(p.Addr())}, nil
}

// FlowHash is the datapath's hash of an inner flow (bpf/lib/lisp.h
// lisp_flow_hash): ports are 0 for other protocols and for fragments.
func FlowHash(src, dst netip.Addr, proto uint8, sport, dport uint16) uint32 {
	s, d := src.As4(), dst.As4()
	h := binary.BigEndian.Uint32(s[:]) * 0x9e3779b1
	h ^= binary.BigEndian.Uint32(d[:]) + 0x7f4a7c15 + (h << 6) + (h >> 2)
	h ^= (uint32(sport)<<16 | uint32(dport)) + 0x85ebca6b + (h << 6) + (h >> 2)
	h ^= uint32(proto)
	h ^= h >> 16
	h *= 0x85ebca6b
	h ^= h >> 13
	h *= 0xc2b2ae35
	h ^= h >> 16
	return h
}

// SourcePort is the outer UDP source port the datapath sends a flow with.
func SourcePort(hash uint32) uint16 { return 0xc000 | uint16(hash&0x3fff) }

// pickSlot is the path the datapath takes for a flow hash from an entry.
func pickSlot(e lispLispEid, hash uint32) uint8 {
	return e.Slots[((hash>>16)%uint32(e.Nslots))&(Slots-1)]
}
