// Package vcmp is the VNAT Connection Migration Protocol (paper
// 001_fcb5a695fe7df1bc, §3.3 and §5.3) as pure logic: the message codec, the
// key agreement and update authentication, the role state machine of a
// connection, the order in which a moved end looks for its peer, and the
// batching of updates per peer. It opens no sockets and touches no kernel;
// the daemon that serves VCMP on TCP port 2031 is built on it.
//
// Every message starts with the same 4-byte word, frozen across versions:
// Version (1 byte), Command (1 byte), Length (2 bytes, the whole message in
// bytes, big-endian). docs/vcmp.md lays out every message byte by byte.
package vcmp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
)

// Version is the VCMP version this package speaks. A decoder refuses any
// other; the header word (version, command, length) keeps its layout in every
// version, so a reader can always frame and skip a message it cannot decode.
const Version = 1

// Port is the well-known VCMP port (paper §5.3).
const Port = 2031

// HeaderLen is the size of the header word every message starts with.
const HeaderLen = 4

// MaxLen is the largest message the 16-bit length field can describe.
const MaxLen = 0xffff

// Command is a message's command byte.
type Command uint8

// The commands. 1–4 are the paper's messages; the rest are the ones the
// paper names without laying them out.
const (
	CmdSuspPrimary   Command = 1  // VNAT_SUSP_PRIMARY: the sender is about to move and claims the primary role
	CmdSuspSecondary Command = 2  // VNAT_SUSP_SECONDARY: the answer accepting the secondary role
	CmdUpdate        Command = 3  // VNAT_UPD: the sender's new physical address for a virtual connection
	CmdUpdateReply   Command = 4  // VNAT_UPD_R: the answer to VNAT_UPD, with the responder's own mapping
	CmdLocQuery      Command = 5  // VCMP_LOC_QUERY: where is the peer of this connection now (optionally store mine)
	CmdLocAnswer     Command = 6  // VCMP_LOC_ANSWER: the answer to a query or a store
	CmdLocStore      Command = 7  // VCMP_LOC_STORE: record the sender's new location for this connection
	CmdKey           Command = 8  // VCMP_KEY: the sender's X25519 public key for this connection
	CmdSealed        Command = 9  // VCMP_AUTH: an update or its reply with a sequence number and HMAC-SHA-256 tag
	CmdBatch         Command = 10 // VCMP_BATCH: several messages to one peer in one
	CmdRelay         Command = 11 // VCMP_RELAY: a host's relay names the endpoint whose stream it carries to the location server
)

var commandNames = map[Command]string{
	CmdSuspPrimary:   "VNAT_SUSP_PRIMARY",
	CmdSuspSecondary: "VNAT_SUSP_SECONDARY",
	CmdUpdate:        "VNAT_UPD",
	CmdUpdateReply:   "VNAT_UPD_R",
	CmdLocQuery:      "VCMP_LOC_QUERY",
	CmdLocAnswer:     "VCMP_LOC_ANSWER",
	CmdLocStore:      "VCMP_LOC_STORE",
	CmdKey:           "VCMP_KEY",
	CmdSealed:        "VCMP_AUTH",
	CmdBatch:         "VCMP_BATCH",
	CmdRelay:         "VCMP_RELAY",
}

// String names the command as docs/vcmp.md does.
func (c Command) String() string {
	if n, ok := commandNames[c]; ok {
		return n
	}
	return fmt.Sprintf("command %d", uint8(c))
}

// Proto is the transport protocol of a virtual connection.
type Proto uint8

// The transport protocols VNAT migrates (issue 10 items 1 and 9).
const (
	TCP Proto = 6
	UDP Proto = 17
)

func (p Proto) valid() bool { return p == TCP || p == UDP }

// String names the protocol.
func (p Proto) String() string {
	switch p {
	case TCP:
		return "tcp"
	case UDP:
		return "udp"
	}
	return fmt.Sprintf("proto %d", uint8(p))
}

// Tuple is a virtual connection seen from one end: the protocol, this end's
// virtual address and port, and the peer's. Virtual endpoints are the
// connection's first physical ones (paper §3.1) and never change.
type Tuple struct {
	Proto  Proto
	Local  netip.AddrPort
	Remote netip.AddrPort
}

// Reverse is the same connection seen from the other end.
func (t Tuple) Reverse() Tuple { return Tuple{Proto: t.Proto, Local: t.Remote, Remote: t.Local} }

// String prints the tuple as proto local->remote.
func (t Tuple) String() string { return fmt.Sprintf("%s %s->%s", t.Proto, t.Local, t.Remote) }

// Record is the paper's connection block shared by every per-connection
// message (figure 3-6): the connection seen from the sender (L_* is the
// sender, R_* its peer) and the sender's physical address and port (L_Phys).
type Record struct {
	Conn Tuple
	Phys netip.AddrPort // L_Phys_Addr, L_Phys_Port
}

// recordLen is the header word plus the paper's four words plus the word
// holding R_Vir_Port, Proto and Code (see docs/vcmp.md, "where we decided").
const recordLen = 24

// Errors a decoder returns, wrapped in a *FieldError that names the field.
var (
	ErrShort    = errors.New("message too short")
	ErrVersion  = errors.New("unsupported version")
	ErrCommand  = errors.New("unknown command")
	ErrLength   = errors.New("wrong length")
	ErrTrailing = errors.New("trailing bytes")
	ErrField    = errors.New("invalid field")
)

// FieldError says which message, field and byte offset a decoder (or
// encoder) refused, and why.
type FieldError struct {
	Command Command // zero when the header itself was refused
	Field   string
	Offset  int
	Err     error // one of the Err* sentinels
	Detail  string
}

func (e *FieldError) Error() string {
	where := "header"
	if e.Command != 0 {
		where = e.Command.String()
	}
	return fmt.Sprintf("vcmp: %s: %s (offset %d): %v: %s", where, e.Field, e.Offset, e.Err, e.Detail)
}

func (e *FieldError) Unwrap() error { return e.Err }

func fieldErr(c Command, field string, off int, err error, format string, a ...any) error {
	return &FieldError{Command: c, Field: field, Offset: off, Err: err, Detail: fmt.Sprintf(format, a...)}
}

// Message is one decoded VCMP message; there is one type per command.
type Message interface {
	// Command is the message's command byte.
	Command() Command
	size() int
	// put writes the body (everything after the header word) into b, which
	// is exactly size() bytes long, header included.
	put(b []byte) error
}

// SuspPrimary is VNAT_SUSP_PRIMARY (paper §3.3.1.2): the sender is about to
// move and claims the primary role. Record.Phys is where the sender is now.
type SuspPrimary struct{ Record }

// SuspSecondary is VNAT_SUSP_SECONDARY: the answer accepting the secondary
// role. Record.Phys is where the sender is now.
type SuspSecondary struct{ Record }

// Update is VNAT_UPD (paper §3.3.2.3, figure 3-6): Record.Phys is the sender's
// new physical address and port for the connection Record.Conn.
type Update struct{ Record }

// UpdateStatus is the result a VNAT_UPD_R reports.
type UpdateStatus uint8

// Update results.
const (
	UpdateOK        UpdateStatus = 0 // mapping updated; Record.Phys is the responder's own physical endpoint
	UpdateUnknown   UpdateStatus = 1 // no such virtual connection here
	UpdateRefused   UpdateStatus = 2 // the update was not authenticated (forged, replayed or unkeyed)
	UpdateConflict  UpdateStatus = 3 // the virtual endpoint conflicts with another connection here (§3.4.2, policy abort)
	updateStatusMax              = UpdateConflict
)

// UpdateReply is VNAT_UPD_R (figure 3-7). Unlike the paper, which leaves the
// connection fields unused, it carries the connection seen from the
// responder so that a reply in a batch names its connection.
type UpdateReply struct {
	Record
	Status UpdateStatus
}

// LocQuery is VCMP_LOC_QUERY (paper §3.3.2.1, P(1)–P(3)): where is the peer
// (Record.Conn.Remote) of this connection now? With Store set the place
// atomically stores the sender's new location (Record.Phys) when it does not
// know the peer's, so two ends asking the same place always meet.
type LocQuery struct {
	Record
	Store bool
}

// LocStatus is the result a VCMP_LOC_ANSWER reports.
type LocStatus uint8

// Location results.
const (
	LocFound     LocStatus = 0 // Peer is the sought end's location
	LocStored    LocStatus = 1 // the sought end is unknown here; the sender's location is stored
	LocNotFound  LocStatus = 2 // the sought end is unknown here and nothing was stored
	LocRefused   LocStatus = 3 // this place keeps no locations for this connection
	locStatusMax           = LocRefused
)

// LocAnswer is VCMP_LOC_ANSWER: the query's record echoed, the status, and
// the sought end's physical address and port when Status is LocFound (zero
// otherwise).
type LocAnswer struct {
	Record
	Status LocStatus
	Peer   netip.AddrPort
}

// LocStore is VCMP_LOC_STORE: record that the sender (Record.Conn.Local) of
// this connection is now at Record.Phys. Answered by a VCMP_LOC_ANSWER with
// LocStored or LocRefused.
type LocStore struct{ Record }

// KeyLen is the size of an X25519 public key.
const KeyLen = 32

// Key is VCMP_KEY (paper §3.3.1.1): the sender's X25519 public key for this
// connection, sent with VNAT_SUSP_PRIMARY and with the answer to it.
type Key struct {
	Record
	Public [KeyLen]byte
}

// TagLen is the size of an HMAC-SHA-256 tag.
const TagLen = 32

const sealedFixed = HeaderLen + 8 + TagLen

// Sealed is VCMP_AUTH: an update or update reply (Inner) with a sequence
// number and an HMAC-SHA-256 tag over every byte before the tag. Build one
// with Seal, check one with Open.
type Sealed struct {
	Seq   uint64
	Inner Message // *Update or *UpdateReply
	Tag   [TagLen]byte
}

// Batch is VCMP_BATCH: several messages to one peer, answered by one batch
// whose entries answer them in the same order (issue 10 item 10).
type Batch struct {
	Entries []Message // any command but VCMP_BATCH
}

const batchFixed = HeaderLen + 4

// Relay is VCMP_RELAY: the first message of a stream a host's agent relays
// from one of its VMs to the location server (docs/vnat-location.md). It
// names the VM, Source, whose daemon opened the stream on the VM's vif: the
// server takes the rest of the stream as coming from Source, if the sender
// is the host the intent places that VM on. It is never in a batch and is
// not answered.
type Relay struct {
	Source netip.Addr
}

const relayLen = HeaderLen + 4

// Command implementations.
func (*SuspPrimary) Command() Command   { return CmdSuspPrimary }
func (*SuspSecondary) Command() Command { return CmdSuspSecondary }
func (*Update) Command() Command        { return CmdUpdate }
func (*UpdateReply) Command() Command   { return CmdUpdateReply }
func (*LocQuery) Command() Command      { return CmdLocQuery }
func (*LocAnswer) Command() Command     { return CmdLocAnswer }
func (*LocStore) Command() Command      { return CmdLocStore }
func (*Key) Command() Command           { return CmdKey }
func (*Sealed) Command() Command        { return CmdSealed }
func (*Batch) Command() Command         { return CmdBatch }
func (*Relay) Command() Command         { return CmdRelay }

func (*SuspPrimary) size() int   { return recordLen }
func (*SuspSecondary) size() int { return recordLen }
func (*Update) size() int        { return recordLen }
func (*UpdateReply) size() int   { return recordLen }
func (*LocQuery) size() int      { return recordLen }
func (*LocAnswer) size() int     { return recordLen + 8 }
func (*LocStore) size() int      { return recordLen }
func (*Key) size() int           { return recordLen + KeyLen }
func (*Relay) size() int         { return relayLen }
func (m *Sealed) size() int {
	if m.Inner == nil {
		return sealedFixed
	}
	return sealedFixed + m.Inner.size()
}
func (m *Batch) size() int {
	n := batchFixed
	for _, e := range m.Entries {
		if e != nil {
			n += e.size()
		}
	}
	return n
}

func (m *SuspPrimary) put(b []byte) error   { return putRecord(b, CmdSuspPrimary, m.Record, 0) }
func (m *SuspSecondary) put(b []byte) error { return putRecord(b, CmdSuspSecondary, m.Record, 0) }
func (m *Update) put(b []byte) error        { return putRecord(b, CmdUpdate, m.Record, 0) }
func (m *LocStore) put(b []byte) error      { return putRecord(b, CmdLocStore, m.Record, 0) }

func (m *UpdateReply) put(b []byte) error {
	if m.Status > updateStatusMax {
		return fieldErr(CmdUpdateReply, "Code (status)", 7, ErrField, "status %d unknown", m.Status)
	}
	return putRecord(b, CmdUpdateReply, m.Record, uint8(m.Status))
}

func (m *LocQuery) put(b []byte) error {
	var code uint8
	if m.Store {
		code = locFlagStore
	}
	return putRecord(b, CmdLocQuery, m.Record, code)
}

const locFlagStore = 0x01

func (m *LocAnswer) put(b []byte) error {
	if m.Status > locStatusMax {
		return fieldErr(CmdLocAnswer, "Code (status)", 7, ErrField, "status %d unknown", m.Status)
	}
	if err := putRecord(b, CmdLocAnswer, m.Record, uint8(m.Status)); err != nil {
		return err
	}
	if m.Status != LocFound {
		if m.Peer.IsValid() {
			return fieldErr(CmdLocAnswer, "R_Phys_Addr", 24, ErrField, "a peer location with status %d (only status 0, found, carries one)", m.Status)
		}
		return nil // R_Phys_* stay zero
	}
	if !m.Peer.Addr().Is4() {
		return fieldErr(CmdLocAnswer, "R_Phys_Addr", 24, ErrField, "%v is not an IPv4 address", m.Peer.Addr())
	}
	a := m.Peer.Addr().As4()
	copy(b[24:28], a[:])
	binary.BigEndian.PutUint16(b[28:], m.Peer.Port())
	return nil
}

func (m *Relay) put(b []byte) error {
	return putAddr(b, CmdRelay, "Source_Addr", 4, m.Source)
}

func (m *Key) put(b []byte) error {
	if err := putRecord(b, CmdKey, m.Record, 0); err != nil {
		return err
	}
	copy(b[recordLen:], m.Public[:])
	return nil
}

func (m *Sealed) put(b []byte) error {
	if err := checkSealable(m.Inner); err != nil {
		return err
	}
	binary.BigEndian.PutUint64(b[4:12], m.Seq)
	end := 12 + m.Inner.size()
	if err := encodeInto(b[12:end], m.Inner); err != nil {
		return err
	}
	copy(b[end:], m.Tag[:])
	return nil
}

func checkSealable(inner Message) error {
	switch inner.(type) {
	case *Update, *UpdateReply:
		return nil
	case nil:
		return fieldErr(CmdSealed, "Inner", 12, ErrField, "no message to seal")
	}
	return fieldErr(CmdSealed, "Inner", 12, ErrField, "%s cannot be sealed (only VNAT_UPD and VNAT_UPD_R are)", inner.Command())
}

func (m *Batch) put(b []byte) error {
	if len(m.Entries) > 0xffff {
		return fieldErr(CmdBatch, "Count", 4, ErrField, "%d entries, at most 65535", len(m.Entries))
	}
	binary.BigEndian.PutUint16(b[4:], uint16(len(m.Entries)))
	off := batchFixed
	for i, e := range m.Entries {
		if e == nil {
			return fieldErr(CmdBatch, fmt.Sprintf("Entries[%d]", i), off, ErrField, "nil entry")
		}
		if e.Command() == CmdBatch || e.Command() == CmdRelay {
			return fieldErr(CmdBatch, fmt.Sprintf("Entries[%d]", i), off, ErrField, "a batch cannot hold a %s", e.Command())
		}
		n := e.size()
		if err := encodeInto(b[off:off+n], e); err != nil {
			return err
		}
		off += n
	}
	return nil
}

func putAddr(b []byte, c Command, field string, off int, a netip.Addr) error {
	if !a.Is4() {
		return fieldErr(c, field, off, ErrField, "%v is not an IPv4 address", a)
	}
	v := a.As4()
	copy(b[off:off+4], v[:])
	return nil
}

// putRecord writes the paper's block (figure 3-6) after the header word.
func putRecord(b []byte, c Command, r Record, code uint8) error {
	if !r.Conn.Proto.valid() {
		return fieldErr(c, "Proto", 6, ErrField, "%d is neither tcp (6) nor udp (17)", r.Conn.Proto)
	}
	binary.BigEndian.PutUint16(b[4:], r.Conn.Remote.Port())
	b[6] = uint8(r.Conn.Proto)
	b[7] = code
	if err := putAddr(b, c, "R_Vir_Addr", 8, r.Conn.Remote.Addr()); err != nil {
		return err
	}
	if err := putAddr(b, c, "L_Vir_Addr", 12, r.Conn.Local.Addr()); err != nil {
		return err
	}
	if err := putAddr(b, c, "L_Phys_Addr", 16, r.Phys.Addr()); err != nil {
		return err
	}
	binary.BigEndian.PutUint16(b[20:], r.Conn.Local.Port())
	binary.BigEndian.PutUint16(b[22:], r.Phys.Port())
	return nil
}

func encodeInto(b []byte, m Message) error {
	b[0] = Version
	b[1] = uint8(m.Command())
	binary.BigEndian.PutUint16(b[2:], uint16(len(b)))
	return m.put(b)
}

// Encode returns the wire bytes of m. It refuses what no decoder would
// accept: non-IPv4 addresses, unknown protocols or statuses, a message
// longer than MaxLen, a sealed message that is not an update.
func Encode(m Message) ([]byte, error) {
	if m == nil {
		return nil, errors.New("vcmp: encode: nil message")
	}
	n := m.size()
	if n > MaxLen {
		return nil, fieldErr(m.Command(), "Length", 2, ErrLength, "%d bytes, more than the 16-bit length field allows (%d)", n, MaxLen)
	}
	b := make([]byte, n)
	if err := encodeInto(b, m); err != nil {
		return nil, err
	}
	return b, nil
}

// fixedLen is the exact length of each fixed-size command; 0 for the
// variable ones.
var fixedLen = map[Command]int{
	CmdSuspPrimary:   recordLen,
	CmdSuspSecondary: recordLen,
	CmdUpdate:        recordLen,
	CmdUpdateReply:   recordLen,
	CmdLocQuery:      recordLen,
	CmdLocAnswer:     recordLen + 8,
	CmdLocStore:      recordLen,
	CmdKey:           recordLen + KeyLen,
	CmdSealed:        0,
	CmdBatch:         0,
	CmdRelay:         relayLen,
}

// Header decodes the frozen header word: version, command and length. It
// checks only that four bytes are there, so a reader can frame a message of
// any version.
func Header(b []byte) (version uint8, cmd Command, length int, err error) {
	if len(b) < HeaderLen {
		return 0, 0, 0, fieldErr(0, "header", 0, ErrShort, "%d bytes, the header word is %d", len(b), HeaderLen)
	}
	return b[0], Command(b[1]), int(binary.BigEndian.Uint16(b[2:])), nil
}

// Decode parses exactly one message filling all of b. It refuses a wrong
// version, an unknown command, a length field that disagrees with the
// command or with len(b), trailing bytes, and any field out of range, each
// with a *FieldError naming the field. The message shares no memory with b.
func Decode(b []byte) (Message, error) {
	return decode(b, true)
}

func decode(b []byte, topLevel bool) (Message, error) {
	ver, cmd, n, err := Header(b)
	if err != nil {
		return nil, err
	}
	if ver != Version {
		return nil, fieldErr(0, "Version", 0, ErrVersion, "version %d, this end speaks %d", ver, Version)
	}
	want, known := fixedLen[cmd]
	if !known {
		return nil, fieldErr(0, "Command", 1, ErrCommand, "command %d", uint8(cmd))
	}
	if n < HeaderLen {
		return nil, fieldErr(cmd, "Length", 2, ErrLength, "length field %d, shorter than the header word", n)
	}
	if want != 0 && n != want {
		return nil, fieldErr(cmd, "Length", 2, ErrLength, "length field %d, %s is %d bytes", n, cmd, want)
	}
	if n%4 != 0 {
		return nil, fieldErr(cmd, "Length", 2, ErrLength, "length field %d, not a multiple of 4 (messages are 32-bit aligned)", n)
	}
	if len(b) < n {
		return nil, fieldErr(cmd, "Length", 2, ErrShort, "length field %d, only %d bytes", n, len(b))
	}
	if len(b) > n {
		return nil, fieldErr(cmd, "Length", 2, ErrTrailing, "%d bytes after the %d-byte message", len(b)-n, n)
	}
	switch cmd {
	case CmdSuspPrimary:
		r, err := record(b, cmd, true)
		if err != nil {
			return nil, err
		}
		return &SuspPrimary{r}, nil
	case CmdSuspSecondary:
		r, err := record(b, cmd, true)
		if err != nil {
			return nil, err
		}
		return &SuspSecondary{r}, nil
	case CmdUpdate:
		r, err := record(b, cmd, true)
		if err != nil {
			return nil, err
		}
		return &Update{r}, nil
	case CmdLocStore:
		r, err := record(b, cmd, true)
		if err != nil {
			return nil, err
		}
		return &LocStore{r}, nil
	case CmdUpdateReply:
		r, err := record(b, cmd, false)
		if err != nil {
			return nil, err
		}
		if UpdateStatus(b[7]) > updateStatusMax {
			return nil, fieldErr(cmd, "Code (status)", 7, ErrField, "status %d unknown", b[7])
		}
		return &UpdateReply{Record: r, Status: UpdateStatus(b[7])}, nil
	case CmdLocQuery:
		r, err := record(b, cmd, false)
		if err != nil {
			return nil, err
		}
		if b[7]&^locFlagStore != 0 {
			return nil, fieldErr(cmd, "Code (flags)", 7, ErrField, "flags %#02x, only 0x01 (store) is defined", b[7])
		}
		return &LocQuery{Record: r, Store: b[7]&locFlagStore != 0}, nil
	case CmdLocAnswer:
		return decodeLocAnswer(b)
	case CmdKey:
		r, err := record(b, cmd, true)
		if err != nil {
			return nil, err
		}
		m := &Key{Record: r}
		copy(m.Public[:], b[recordLen:])
		return m, nil
	case CmdSealed:
		return decodeSealed(b)
	case CmdBatch:
		if !topLevel {
			return nil, fieldErr(cmd, "Command", 1, ErrField, "a batch inside a batch")
		}
		return decodeBatch(b)
	case CmdRelay:
		if !topLevel {
			return nil, fieldErr(cmd, "Command", 1, ErrField, "a relay header inside a batch")
		}
		return &Relay{Source: netip.AddrFrom4([4]byte(b[4:8]))}, nil
	}
	panic("unreachable: command in fixedLen without a decoder")
}

// record parses the paper's block; zeroCode requires the Code byte to be 0
// for commands that define none.
func record(b []byte, cmd Command, zeroCode bool) (Record, error) {
	p := Proto(b[6])
	if !p.valid() {
		return Record{}, fieldErr(cmd, "Proto", 6, ErrField, "%d is neither tcp (6) nor udp (17)", b[6])
	}
	if zeroCode && b[7] != 0 {
		return Record{}, fieldErr(cmd, "Code", 7, ErrField, "%#02x, must be 0 in %s", b[7], cmd)
	}
	addr := func(off int) netip.Addr { return netip.AddrFrom4([4]byte(b[off : off+4])) }
	return Record{
		Conn: Tuple{
			Proto:  p,
			Remote: netip.AddrPortFrom(addr(8), binary.BigEndian.Uint16(b[4:])),
			Local:  netip.AddrPortFrom(addr(12), binary.BigEndian.Uint16(b[20:])),
		},
		Phys: netip.AddrPortFrom(addr(16), binary.BigEndian.Uint16(b[22:])),
	}, nil
}

func decodeLocAnswer(b []byte) (Message, error) {
	r, err := record(b, CmdLocAnswer, false)
	if err != nil {
		return nil, err
	}
	st := LocStatus(b[7])
	if st > locStatusMax {
		return nil, fieldErr(CmdLocAnswer, "Code (status)", 7, ErrField, "status %d unknown", b[7])
	}
	if binary.BigEndian.Uint16(b[30:]) != 0 {
		return nil, fieldErr(CmdLocAnswer, "Reserved", 30, ErrField, "%#04x, must be 0", binary.BigEndian.Uint16(b[30:]))
	}
	m := &LocAnswer{Record: r, Status: st}
	if st != LocFound {
		for i := 24; i < 30; i++ {
			if b[i] != 0 {
				return nil, fieldErr(CmdLocAnswer, "R_Phys_Addr/R_Phys_Port", 24, ErrField, "non-zero with status %d (only status 0, found, carries a location)", st)
			}
		}
		return m, nil
	}
	m.Peer = netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[24:28])), binary.BigEndian.Uint16(b[28:]))
	return m, nil
}

func decodeSealed(b []byte) (Message, error) {
	if len(b) < sealedFixed+HeaderLen {
		return nil, fieldErr(CmdSealed, "Length", 2, ErrLength, "%d bytes, a sealed message is at least %d", len(b), sealedFixed+HeaderLen)
	}
	inner := b[12 : len(b)-TagLen]
	_, icmd, in, err := Header(inner)
	if err != nil {
		return nil, err
	}
	if icmd != CmdUpdate && icmd != CmdUpdateReply {
		return nil, fieldErr(CmdSealed, "Inner.Command", 13, ErrField, "%s cannot be sealed (only VNAT_UPD and VNAT_UPD_R are)", icmd)
	}
	if in != len(inner) {
		return nil, fieldErr(CmdSealed, "Inner.Length", 14, ErrLength, "inner length field %d, the sealed message leaves %d bytes for it", in, len(inner))
	}
	m, err := decode(inner, false)
	if err != nil {
		return nil, fmt.Errorf("vcmp: VCMP_AUTH: inner message at offset 12: %w", err)
	}
	s := &Sealed{Seq: binary.BigEndian.Uint64(b[4:12]), Inner: m}
	copy(s.Tag[:], b[len(b)-TagLen:])
	return s, nil
}

func decodeBatch(b []byte) (Message, error) {
	if len(b) < batchFixed {
		return nil, fieldErr(CmdBatch, "Length", 2, ErrLength, "%d bytes, a batch is at least %d", len(b), batchFixed)
	}
	count := int(binary.BigEndian.Uint16(b[4:]))
	if r := binary.BigEndian.Uint16(b[6:]); r != 0 {
		return nil, fieldErr(CmdBatch, "Reserved", 6, ErrField, "%#04x, must be 0", r)
	}
	m := &Batch{Entries: make([]Message, 0, min(count, len(b)/recordLen))}
	off := batchFixed
	for i := 0; i < count; i++ {
		_, _, n, err := Header(b[off:])
		if err != nil {
			return nil, fieldErr(CmdBatch, fmt.Sprintf("Entries[%d]", i), off, ErrShort, "count says %d entries, the batch ends after %d", count, i)
		}
		if n < HeaderLen || off+n > len(b) {
			return nil, fieldErr(CmdBatch, fmt.Sprintf("Entries[%d].Length", i), off+2, ErrLength, "length field %d, %d bytes left in the batch", n, len(b)-off)
		}
		e, err := decode(b[off:off+n], false)
		if err != nil {
			return nil, fmt.Errorf("vcmp: VCMP_BATCH: entry %d at offset %d: %w", i, off, err)
		}
		m.Entries = append(m.Entries, e)
		off += n
	}
	if off != len(b) {
		return nil, fieldErr(CmdBatch, "Entries", off, ErrTrailing, "%d bytes after the %d entries the count field announces", len(b)-off, count)
	}
	return m, nil
}
