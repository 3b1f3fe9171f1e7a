package xtr

import (
	"encoding/binary"
	"net/netip"
	"sort"
	"time"

	"github.com/onehop/onehop/internal/csum"
	"github.com/onehop/onehop/internal/lisp"
	"github.com/onehop/onehop/internal/lispdp"
)

// Tunnel is one datapath path of the xTR: out of its RLOC number RLOC (an
// index into Config.RLOCs) to a remote locator.
type Tunnel struct {
	RLOC   int
	Remote netip.Addr
}

// Choice is one usable locator of a mapping, as the datapath takes it.
type Choice struct {
	Tunnel
	Priority, Weight uint8
}

// Plan turns a Map-Reply's record into the tunnels that carry its EIDs:
// one per usable locator (priority below 255) that one of the xTR's RLOC
// interfaces reaches (find says which, by the routes). A locator no RLOC
// reaches is left out; nil means nothing can carry the record.
func Plan(rec lisp.Record, find func(netip.Addr) (int, bool)) []Choice {
	var out []Choice
	for _, l := range rec.Usable() {
		if !l.Addr.Is4() {
			continue // IPv4 RLOCs only (docs/lisp-datapath.md)
		}
		i, ok := find(l.Addr)
		if !ok {
			continue
		}
		out = append(out, Choice{Tunnel: Tunnel{RLOC: i, Remote: l.Addr}, Priority: l.Priority, Weight: l.Weight})
	}
	return out
}

// Tunnels hands out datapath path ids, one per Tunnel, for as long as the
// daemon runs (there are at most MaxRLOCs × remote locators of them).
type Tunnels struct {
	ids map[Tunnel]uint8
}

// ID returns t's path id and whether it is new; false ok when every id is
// taken.
func (ts *Tunnels) ID(t Tunnel) (id uint8, isNew, ok bool) {
	if ts.ids == nil {
		ts.ids = map[Tunnel]uint8{}
	}
	if id, found := ts.ids[t]; found {
		return id, false, true
	}
	if len(ts.ids) >= lispdp.MaxPaths-1 {
		return 0, false, false
	}
	id = uint8(len(ts.ids) + 1) // 0 is never used: an unset slot reads 0
	ts.ids[t] = id
	return id, true, true
}

// Of returns the tunnel of path id.
func (ts *Tunnels) Of(id uint8) (Tunnel, bool) {
	for t, i := range ts.ids {
		if i == id {
			return t, true
		}
	}
	return Tunnel{}, false
}

// Retry is how long the cache waits before asking again about an EID whose
// Map-Request failed, and how long a record with TTL 0 ("use once") is kept
// before it is asked for again.
const Retry = 5 * time.Second

// MaxEntries bounds the remote EIDs an xTR follows.
const MaxEntries = 4096

// Cache is the xTR's list of remote EIDs it has seen and when each must be
// asked for again. An entry starts as an address seen opening a connection;
// once resolved it covers the record's prefix (so another address of the
// same prefix is not asked for) until the record's TTL runs out, when it is
// due again. Entries are never dropped on a timer: an established flow
// sends no new SYN, and its replies need the mapping for as long as it
// lasts; a negative answer removes it.
type Cache struct {
	entries map[netip.Addr]*Entry
}

// Entry is one followed remote EID.
type Entry struct {
	// Addr is the address that was seen.
	Addr netip.Addr `json:"addr"`
	// Prefix is the record's EID prefix once resolved.
	Prefix netip.Prefix `json:"prefix,omitzero"`
	// Due is when to ask the map-resolver (again).
	Due time.Time `json:"due"`
	// Choices are the tunnels installed for it.
	Choices []Choice `json:"choices,omitempty"`
}

// Seen records that eid opened a connection at now and reports whether it
// must be resolved now (it is neither followed nor covered by a resolved
// prefix). false as well when the cache is full.
func (c *Cache) Seen(eid netip.Addr, now time.Time) bool {
	if c.entries == nil {
		c.entries = map[netip.Addr]*Entry{}
	}
	if _, ok := c.entries[eid]; ok {
		return false
	}
	for _, e := range c.entries {
		if e.Prefix.IsValid() && e.Prefix.Contains(eid) {
			return false
		}
	}
	if len(c.entries) >= MaxEntries {
		return false
	}
	c.entries[eid] = &Entry{Addr: eid, Due: now}
	return true
}

// Resolved records the answer about eid at now: the record's prefix and
// the tunnels it was installed with, due again when its TTL runs out. A
// negative record (or one nothing can carry: no choices) ends the entry;
// it returns the prefix to remove from the datapath then, if one was
// installed.
func (c *Cache) Resolved(eid netip.Addr, rec lisp.Record, choices []Choice, now time.Time) (remove netip.Prefix) {
	e, ok := c.entries[eid]
	if !ok {
		return netip.Prefix{}
	}
	if rec.Negative() || len(choices) == 0 {
		delete(c.entries, eid)
		if len(e.Choices) > 0 {
			return e.Prefix
		}
		return netip.Prefix{}
	}
	if e.Prefix.IsValid() && e.Prefix != rec.EID && len(e.Choices) > 0 {
		remove = e.Prefix // the mapping moved to another prefix
	}
	ttl := rec.TTL
	if ttl <= 0 {
		ttl = Retry
	}
	e.Prefix, e.Choices, e.Due = rec.EID, choices, now.Add(ttl)
	return remove
}

// Failed records that asking about eid failed at now: asked again after
// Retry, the installed mapping (if any) kept meanwhile.
func (c *Cache) Failed(eid netip.Addr, now time.Time) {
	if e, ok := c.entries[eid]; ok {
		e.Due = now.Add(Retry)
	}
}

// Due lists the addresses to ask about at now, in address order.
func (c *Cache) Due(now time.Time) []netip.Addr {
	var out []netip.Addr
	for a, e := range c.entries {
		if !now.Before(e.Due) {
			out = append(out, a)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Less(out[j]) })
	return out
}

// Next is when the earliest entry is due; zero when there is none.
func (c *Cache) Next() time.Time {
	var next time.Time
	for _, e := range c.entries {
		if next.IsZero() || e.Due.Before(next) {
			next = e.Due
		}
	}
	return next
}

// Installed counts the entries with a mapping in the datapath.
func (c *Cache) Installed() int {
	n := 0
	for _, e := range c.entries {
		if len(e.Choices) > 0 {
			n++
		}
	}
	return n
}

// Entries returns a copy of every entry, in address order.
func (c *Cache) Entries() []Entry {
	out := make([]Entry, 0, len(c.entries))
	for _, e := range c.entries {
		out = append(out, *e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Addr.Less(out[j].Addr) })
	return out
}

// Syn is a LISP-encapsulated TCP SYN an RLOC interface received: a remote
// EID opening a connection into the site.
type Syn struct {
	OuterSrc, OuterDst netip.Addr
	// EID is the inner source.
	EID netip.Addr
	// Inner is the inner IPv4 packet (a copy), to hand to the site again
	// once the EID's mapping is installed.
	Inner []byte
}

// SynOf reads an Ethernet frame received on an RLOC interface and returns
// the LISP-encapsulated TCP SYN in it, sent to a local RLOC from a remote
// locator. Anything else is ok=false. (The socket's filter passes only
// such frames; this checks them again in full, since a filter's bounds are
// not a parser's.)
func SynOf(frame []byte) (s Syn, ok bool) {
	const eth = 14
	if len(frame) < eth+20 || binary.BigEndian.Uint16(frame[12:]) != 0x0800 {
		return
	}
	ip := frame[eth:]
	ihl := int(ip[0]&0x0f) * 4
	if ip[0]>>4 != 4 || ihl < 20 || len(ip) < ihl+8+8+20 || ip[9] != 17 || binary.BigEndian.Uint16(ip[6:])&0x3fff != 0 {
		return
	}
	udp := ip[ihl:]
	if binary.BigEndian.Uint16(udp[2:]) != lispdp.DataPort {
		return
	}
	in := udp[16:] // UDP 8 + LISP 8
	iihl := int(in[0]&0x0f) * 4
	total := int(binary.BigEndian.Uint16(in[2:]))
	if in[0]>>4 != 4 || iihl < 20 || total < iihl+20 || total > len(in) || in[9] != 6 {
		return
	}
	if in[iihl+13]&0x02 == 0 { // SYN
		return
	}
	s.OuterSrc = netip.AddrFrom4([4]byte(ip[12:16]))
	s.OuterDst = netip.AddrFrom4([4]byte(ip[16:20]))
	s.EID = netip.AddrFrom4([4]byte(in[12:16]))
	s.Inner = append([]byte(nil), in[:total]...)
	return s, true
}

// FixTCPChecksum rewrites the TCP checksum of an IPv4 packet. A SYN read
// off the wire may carry only the pseudo-header sum its sender's stack
// left for an offload that never ran (veths pass CHECKSUM_PARTIAL along),
// which a receiver given the same bytes from a raw socket would drop.
func FixTCPChecksum(pkt []byte) {
	ihl := int(pkt[0]&0x0f) * 4
	total := int(binary.BigEndian.Uint16(pkt[2:]))
	if len(pkt) < total || total < ihl+20 || pkt[9] != 6 {
		return
	}
	seg := pkt[ihl:total]
	seg[16], seg[17] = 0, 0
	binary.BigEndian.PutUint16(seg[16:], csum.Transport(pkt[12:16], pkt[16:20], csum.ProtoTCP, seg))
}
