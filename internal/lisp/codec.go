package lisp

import (
	"encoding/binary"
	"fmt"
	"math"
	"net/netip"
	"time"
)

// Type is a control message's type, the top 4 bits of its first byte
// (RFC 9301 §5.1; IANA "LISP Packet Types").
type Type uint8

// The control message types this package speaks.
const (
	TypeMapRequest   Type = 1
	TypeMapReply     Type = 2
	TypeMapRegister  Type = 3
	TypeMapNotify    Type = 4
	TypeMapNotifyAck Type = 5
	TypeECM          Type = 8 // Encapsulated Control Message (DecodeECM)
)

var typeNames = map[Type]string{TypeMapRequest: "map-request", TypeMapReply: "map-reply",
	TypeMapRegister: "map-register", TypeMapNotify: "map-notify", TypeMapNotifyAck: "map-notify-ack", TypeECM: "ecm"}

// String names the type.
func (t Type) String() string {
	if n, ok := typeNames[t]; ok {
		return n
	}
	return fmt.Sprintf("type %d", uint8(t))
}

// MessageType returns the type of the control message b, without decoding
// it.
func MessageType(b []byte) (Type, error) {
	if len(b) == 0 {
		return 0, &Error{Message: "control message", Field: "type", Reason: "empty message"}
	}
	return Type(b[0] >> 4), nil
}

// Error is a decoding (or encoding) failure: which message, which field,
// at which byte offset of the message, and why.
type Error struct {
	Message string // "map-reply"
	Field   string // "record 0 locator 1 afi"
	Offset  int
	Reason  string
}

func (e *Error) Error() string {
	return fmt.Sprintf("lisp: %s: %s at byte %d: %s", e.Message, e.Field, e.Offset, e.Reason)
}

// reader walks a message and names where it fails.
type reader struct {
	b   []byte
	off int
	msg string
}

func (r *reader) fail(field string, at int, format string, a ...any) error {
	return &Error{Message: r.msg, Field: field, Offset: at, Reason: fmt.Sprintf(format, a...)}
}

func (r *reader) need(n int, field string) error {
	if left := len(r.b) - r.off; left < n {
		return r.fail(field, r.off, "truncated: need %d bytes, %d left", n, left)
	}
	return nil
}

func (r *reader) u8(field string) (uint8, error) {
	if err := r.need(1, field); err != nil {
		return 0, err
	}
	r.off++
	return r.b[r.off-1], nil
}

func (r *reader) u16(field string) (uint16, error) {
	if err := r.need(2, field); err != nil {
		return 0, err
	}
	r.off += 2
	return binary.BigEndian.Uint16(r.b[r.off-2:]), nil
}

func (r *reader) u32(field string) (uint32, error) {
	if err := r.need(4, field); err != nil {
		return 0, err
	}
	r.off += 4
	return binary.BigEndian.Uint32(r.b[r.off-4:]), nil
}

func (r *reader) u64(field string) (uint64, error) {
	if err := r.need(8, field); err != nil {
		return 0, err
	}
	r.off += 8
	return binary.BigEndian.Uint64(r.b[r.off-8:]), nil
}

// addr reads an AFI and the address it announces. allowNone admits AFI 0
// (no address).
func (r *reader) addr(field string, allowNone bool) (netip.Addr, error) {
	at := r.off
	afi, err := r.u16(field + " afi")
	if err != nil {
		return netip.Addr{}, err
	}
	switch afi {
	case AFINone:
		if allowNone {
			return netip.Addr{}, nil
		}
		return netip.Addr{}, r.fail(field+" afi", at, "afi 0 (no address) where an address is required")
	case AFIIPv4:
		if err := r.need(4, field); err != nil {
			return netip.Addr{}, err
		}
		a := netip.AddrFrom4([4]byte(r.b[r.off : r.off+4]))
		r.off += 4
		return a, nil
	case AFIIPv6:
		if err := r.need(16, field); err != nil {
			return netip.Addr{}, err
		}
		a := netip.AddrFrom16([16]byte(r.b[r.off : r.off+16]))
		r.off += 16
		return a, nil
	case 16387:
		return netip.Addr{}, r.fail(field+" afi", at, "afi 16387 (LCAF) is not supported: want 1 (IPv4) or 2 (IPv6)")
	}
	return netip.Addr{}, r.fail(field+" afi", at, "afi %d is not supported: want 1 (IPv4) or 2 (IPv6)", afi)
}

// prefix reads an address of the AFI at the offset and makes it a canonical
// prefix of maskLen bits.
func (r *reader) prefix(field string, maskLen uint8, maskAt int) (netip.Prefix, error) {
	a, err := r.addr(field, false)
	if err != nil {
		return netip.Prefix{}, err
	}
	if int(maskLen) > a.BitLen() {
		return netip.Prefix{}, r.fail(field+" mask-len", maskAt, "mask length %d is longer than the %d bits of %s", maskLen, a.BitLen(), a)
	}
	p := netip.PrefixFrom(a, int(maskLen))
	if p.Masked() != p {
		return netip.Prefix{}, r.fail(field, maskAt, "%s has bits set past its mask length (want %s)", p, p.Masked())
	}
	return p, nil
}

// end refuses bytes after the last field.
func (r *reader) end() error {
	if r.off != len(r.b) {
		return r.fail("end", r.off, "%d bytes after the last record", len(r.b)-r.off)
	}
	return nil
}

func appendAddr(b []byte, a netip.Addr) []byte {
	switch {
	case !a.IsValid():
		return binary.BigEndian.AppendUint16(b, AFINone)
	case a.Is4():
		b = binary.BigEndian.AppendUint16(b, AFIIPv4)
		v := a.As4()
		return append(b, v[:]...)
	default:
		b = binary.BigEndian.AppendUint16(b, AFIIPv6)
		v := a.As16()
		return append(b, v[:]...)
	}
}

func checkAddr(a netip.Addr, field string) error {
	if !a.IsValid() || a.Is4In6() || a.Zone() != "" {
		return fmt.Errorf("%s: %q is not a plain IPv4 or IPv6 address", field, a)
	}
	return nil
}

// Record layout (RFC 9301 §5.4), offsets from the record's start:
//
//	0  Record TTL (32, minutes)
//	4  Locator Count (8)   5 EID mask-len (8)
//	6  ACT (3) A (1) Reserved (12)
//	8  Rsvd (4) Map-Version Number (12)
//	10 EID-Prefix-AFI (16)  12 EID-Prefix (32 or 128)
//	then Locator Count locators:
//	0 Priority 1 Weight 2 M Priority 3 M Weight
//	4 Unused Flags (13) L p R   6 Loc-AFI (16)   8 Locator
const (
	locFlagLocal     = 0x0004
	locFlagProbed    = 0x0002
	locFlagReachable = 0x0001
)

// maxTTLMinutes is the longest record TTL a time.Duration holds.
const maxTTLMinutes = math.MaxInt64 / int64(time.Minute)

func appendRecord(b []byte, r Record) ([]byte, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	ttl, _ := ttlMinutes(r.TTL)
	b = binary.BigEndian.AppendUint32(b, ttl)
	b = append(b, uint8(len(r.Locators)), uint8(r.EID.Bits()))
	word := uint16(r.Action) << 13
	if r.Authoritative {
		word |= 1 << 12
	}
	b = binary.BigEndian.AppendUint16(b, word)
	b = binary.BigEndian.AppendUint16(b, r.MapVersion&0xfff)
	b = appendAddr(b, r.EID.Addr())
	for _, l := range r.Locators {
		b = append(b, l.Priority, l.Weight, l.MPriority, l.MWeight)
		var flags uint16
		if l.Local {
			flags |= locFlagLocal
		}
		if l.Probed {
			flags |= locFlagProbed
		}
		if l.Reachable {
			flags |= locFlagReachable
		}
		b = binary.BigEndian.AppendUint16(b, flags)
		b = appendAddr(b, l.Addr)
	}
	return b, nil
}

func (r *reader) record(name string) (Record, error) {
	var rec Record
	at := r.off
	ttl, err := r.u32(name + " ttl")
	if err != nil {
		return rec, err
	}
	if int64(ttl) > maxTTLMinutes {
		return rec, r.fail(name+" ttl", at, "%d minutes is over the %d this implementation holds", ttl, maxTTLMinutes)
	}
	rec.TTL = time.Duration(ttl) * time.Minute
	count, err := r.u8(name + " locator count")
	if err != nil {
		return rec, err
	}
	maskAt := r.off
	maskLen, err := r.u8(name + " eid mask-len")
	if err != nil {
		return rec, err
	}
	actAt := r.off
	word, err := r.u16(name + " act")
	if err != nil {
		return rec, err
	}
	rec.Action = Action(word >> 13)
	if !rec.Action.Valid() {
		return rec, r.fail(name+" act", actAt, "action %d is unassigned (want 0-5)", rec.Action)
	}
	rec.Authoritative = word&(1<<12) != 0
	ver, err := r.u16(name + " map-version")
	if err != nil {
		return rec, err
	}
	rec.MapVersion = ver & 0xfff
	if rec.EID, err = r.prefix(name+" eid", maskLen, maskAt); err != nil {
		return rec, err
	}
	if count > 0 {
		rec.Locators = make([]Locator, 0, count)
	}
	for i := range int(count) {
		lname := fmt.Sprintf("%s locator %d", name, i)
		if err := r.need(6, lname); err != nil {
			return rec, err
		}
		p := r.b[r.off:]
		l := Locator{Priority: p[0], Weight: p[1], MPriority: p[2], MWeight: p[3]}
		flags := binary.BigEndian.Uint16(p[4:])
		l.Local, l.Probed, l.Reachable = flags&locFlagLocal != 0, flags&locFlagProbed != 0, flags&locFlagReachable != 0
		r.off += 6
		if l.Addr, err = r.addr(lname, false); err != nil {
			return rec, err
		}
		rec.Locators = append(rec.Locators, l)
	}
	return rec, nil
}

// MapRequest asks for the mapping of one or more EIDs (RFC 9301 §5.2).
// Sent to a map-resolver on UDP 4342; the reply goes to the request's UDP
// source port.
type MapRequest struct {
	Nonce          uint64
	Authoritative  bool // A: the request is for an authoritative reply
	Probe          bool // P: RLOC probe
	SMR            bool // S: solicit-map-request
	PITR           bool // p: sent by a proxy ITR
	SMRInvoked     bool // s: sent because of an SMR
	SourceEID      netip.Addr
	ITRRLOCs       []netip.Addr   // where the ITR can be reached: 1 to 32
	EIDs           []netip.Prefix // the EIDs asked for: 1 to 255 (senders send 1)
	MapReplyRecord *Record        // M: the sender's own mapping, optional
}

// Map-Request first word (bit 0 = most significant): Type 0-3, A 4, M 5,
// P 6, S 7, p 8, s 9, R 10, R 11, Rsvd 12-16, L 17, D 18, IRC 19-23,
// Record Count 24-31.
const (
	reqA    = 1 << 27
	reqM    = 1 << 26
	reqP    = 1 << 25
	reqS    = 1 << 24
	reqPITR = 1 << 23
	reqSMRI = 1 << 22
)

// Encode writes the request.
func (m *MapRequest) Encode() ([]byte, error) {
	if n := len(m.ITRRLOCs); n < 1 || n > 32 {
		return nil, fmt.Errorf("map-request: %d ITR-RLOCs: want 1 to 32", n)
	}
	if n := len(m.EIDs); n < 1 || n > 255 {
		return nil, fmt.Errorf("map-request: %d EID records: want 1 to 255", n)
	}
	if m.SourceEID.IsValid() {
		if err := checkAddr(m.SourceEID, "map-request: source EID"); err != nil {
			return nil, err
		}
	}
	w := uint32(TypeMapRequest)<<28 | uint32(len(m.ITRRLOCs)-1)<<8 | uint32(len(m.EIDs))
	for _, f := range []struct {
		on  bool
		bit uint32
	}{{m.Authoritative, reqA}, {m.MapReplyRecord != nil, reqM}, {m.Probe, reqP}, {m.SMR, reqS}, {m.PITR, reqPITR}, {m.SMRInvoked, reqSMRI}} {
		if f.on {
			w |= f.bit
		}
	}
	b := binary.BigEndian.AppendUint32(make([]byte, 0, 64), w)
	b = binary.BigEndian.AppendUint64(b, m.Nonce)
	b = appendAddr(b, m.SourceEID)
	for i, a := range m.ITRRLOCs {
		if err := checkAddr(a, fmt.Sprintf("map-request: ITR-RLOC %d", i)); err != nil {
			return nil, err
		}
		b = appendAddr(b, a)
	}
	for i, p := range m.EIDs {
		if !p.IsValid() || p.Masked() != p || p.Addr().Is4In6() || p.Addr().Zone() != "" {
			return nil, fmt.Errorf("map-request: EID record %d: %q is not a canonical IPv4 or IPv6 prefix", i, p)
		}
		b = append(b, 0, uint8(p.Bits()))
		b = appendAddr(b, p.Addr())
	}
	if m.MapReplyRecord != nil {
		var err error
		if b, err = appendRecord(b, *m.MapReplyRecord); err != nil {
			return nil, fmt.Errorf("map-request: map-reply record: %w", err)
		}
	}
	if len(b) > MaxMessageLen {
		return nil, fmt.Errorf("map-request: %d bytes: over the %d-byte limit", len(b), MaxMessageLen)
	}
	return b, nil
}

func header(b []byte, msg string, want ...Type) (*reader, uint32, error) {
	r := &reader{b: b, msg: msg}
	if len(b) > MaxMessageLen {
		return nil, 0, r.fail("length", MaxMessageLen, "%d bytes: over the %d-byte limit", len(b), MaxMessageLen)
	}
	w, err := r.u32("header")
	if err != nil {
		return nil, 0, err
	}
	t := Type(w >> 28)
	for _, ok := range want {
		if t == ok {
			return r, w, nil
		}
	}
	return nil, 0, r.fail("type", 0, "type %d (%s), want %d (%s)", uint8(t), t, uint8(want[0]), want[0])
}

// DecodeMapRequest reads a Map-Request.
func DecodeMapRequest(b []byte) (MapRequest, error) {
	var m MapRequest
	r, w, err := header(b, "map-request", TypeMapRequest)
	if err != nil {
		return m, err
	}
	m.Authoritative, m.Probe, m.SMR = w&reqA != 0, w&reqP != 0, w&reqS != 0
	m.PITR, m.SMRInvoked = w&reqPITR != 0, w&reqSMRI != 0
	irc, count := int(w>>8&0x1f)+1, int(w&0xff)
	if count == 0 {
		return m, r.fail("record count", 3, "0 records: a Map-Request asks for at least one EID")
	}
	if m.Nonce, err = r.u64("nonce"); err != nil {
		return m, err
	}
	if m.SourceEID, err = r.addr("source eid", true); err != nil {
		return m, err
	}
	m.ITRRLOCs = make([]netip.Addr, 0, irc)
	for i := range irc {
		a, err := r.addr(fmt.Sprintf("itr-rloc %d", i), false)
		if err != nil {
			return m, err
		}
		m.ITRRLOCs = append(m.ITRRLOCs, a)
	}
	m.EIDs = make([]netip.Prefix, 0, count)
	for i := range count {
		name := fmt.Sprintf("eid record %d", i)
		if _, err := r.u8(name + " reserved"); err != nil {
			return m, err
		}
		maskAt := r.off
		maskLen, err := r.u8(name + " mask-len")
		if err != nil {
			return m, err
		}
		p, err := r.prefix(name, maskLen, maskAt)
		if err != nil {
			return m, err
		}
		m.EIDs = append(m.EIDs, p)
	}
	if w&reqM != 0 {
		rec, err := r.record("map-reply record")
		if err != nil {
			return m, err
		}
		m.MapReplyRecord = &rec
	}
	return m, r.end()
}

// MapReply answers a Map-Request with the records it asked for; a record
// with no locators is a negative reply (RFC 9301 §5.4).
type MapReply struct {
	Nonce     uint64 // the request's
	Probe     bool   // P: answers an RLOC probe
	EchoNonce bool   // E: the ETR can echo nonces
	Security  bool   // S: LISP-SEC data follows (refused by the decoder: not supported)
	Records   []Record
}

// Map-Reply first word: Type 0-3, P 4, E 5, S 6, Reserved 7-23, Record
// Count 24-31.
const (
	repP = 1 << 27
	repE = 1 << 26
	repS = 1 << 25
)

// Encode writes the reply.
func (m *MapReply) Encode() ([]byte, error) {
	if n := len(m.Records); n < 1 || n > 255 {
		return nil, fmt.Errorf("map-reply: %d records: want 1 to 255", n)
	}
	if m.Security {
		return nil, fmt.Errorf("map-reply: the S bit (LISP-SEC) is not supported")
	}
	w := uint32(TypeMapReply)<<28 | uint32(len(m.Records))
	if m.Probe {
		w |= repP
	}
	if m.EchoNonce {
		w |= repE
	}
	b := binary.BigEndian.AppendUint32(make([]byte, 0, 64), w)
	b = binary.BigEndian.AppendUint64(b, m.Nonce)
	for i, rec := range m.Records {
		var err error
		if b, err = appendRecord(b, rec); err != nil {
			return nil, fmt.Errorf("map-reply: record %d: %w", i, err)
		}
	}
	if len(b) > MaxMessageLen {
		return nil, fmt.Errorf("map-reply: %d bytes: over the %d-byte limit", len(b), MaxMessageLen)
	}
	return b, nil
}

// DecodeMapReply reads a Map-Reply.
func DecodeMapReply(b []byte) (MapReply, error) {
	var m MapReply
	r, w, err := header(b, "map-reply", TypeMapReply)
	if err != nil {
		return m, err
	}
	m.Probe, m.EchoNonce = w&repP != 0, w&repE != 0
	if w&repS != 0 {
		// LISP-SEC data would follow the records; without support for
		// it the message cannot be framed, so it is refused.
		return m, r.fail("s bit", 0, "LISP-SEC (S bit) is not supported")
	}
	count := int(w & 0xff)
	if count == 0 {
		return m, r.fail("record count", 3, "0 records: a Map-Reply carries at least one")
	}
	if m.Nonce, err = r.u64("nonce"); err != nil {
		return m, err
	}
	m.Records = make([]Record, 0, count)
	for i := range count {
		rec, err := r.record(fmt.Sprintf("record %d", i))
		if err != nil {
			return m, err
		}
		m.Records = append(m.Records, rec)
	}
	return m, r.end()
}
