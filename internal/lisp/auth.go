package lisp

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
)

// AlgorithmID names the MAC of a Map-Register's or Map-Notify's
// authentication data (RFC 9301 §5.6; IANA "LISP Algorithm ID Numbers").
type AlgorithmID uint8

// The algorithm ids. Only HMAC-SHA-256-128 is implemented; a message with
// another is decoded but never authenticates.
const (
	AlgNone           AlgorithmID = 0 // no authentication data: always refused by a map-server here
	AlgHMACSHA1_96    AlgorithmID = 1 // HMAC-SHA-1-96 (RFC 2404): not implemented
	AlgHMACSHA256_128 AlgorithmID = 2 // HMAC-SHA-256-128 (RFC 4868): HMAC-SHA-256 truncated to its first 16 bytes
)

// AuthLen is the length of HMAC-SHA-256-128 authentication data: RFC 4868
// truncates the 32-byte HMAC-SHA-256 output to its leftmost 128 bits.
const AuthLen = 16

// Authentication failures, told apart so a map-server can count each.
var (
	ErrNoAuth               = errors.New("lisp: message carries no authentication data (algorithm 0)")
	ErrUnsupportedAlgorithm = errors.New("lisp: authentication algorithm not supported (want 2, HMAC-SHA-256-128)")
	ErrBadAuth              = errors.New("lisp: authentication data does not match (wrong key or altered message)")
)

// XTRID is the xTR-ID and site-ID a Map-Register carries when its I bit is
// set (RFC 9301 §5.6), after the last record.
type XTRID struct {
	ID     [16]byte
	SiteID uint64
}

const xtrIDLen = 24

// MapRegister is what an ETR sends a map-server to register its EID
// prefixes (RFC 9301 §5.6). Encode it with Seal; a map-server decodes it
// with DecodeMapRegister and checks it with Authenticate.
type MapRegister struct {
	Nonce         uint64 // incremented on every Map-Register: a map-server refuses one not above the last it accepted
	ProxyReply    bool   // P: the map-server answers Map-Requests for these EIDs itself
	UseTTL        bool   // T: time the registration out after the record TTL, not the default 3 minutes
	WantMapNotify bool   // M: acknowledge with a Map-Notify
	KeyID         uint8
	AlgorithmID   AlgorithmID
	AuthData      []byte
	Records       []Record
	XTRID         *XTRID // I bit
}

// MapNotify is a map-server's acknowledgement of a Map-Register (type 4),
// or an xTR's of a Map-Notify (type 5, Map-Notify-Ack); same body as a
// Map-Register (RFC 9301 §5.7).
type MapNotify struct {
	Nonce       uint64 // the Map-Register's
	Ack         bool   // type 5
	KeyID       uint8
	AlgorithmID AlgorithmID
	AuthData    []byte
	Records     []Record
}

// Map-Register first word: Type 0-3, P 4, S 5, I 6, Reserved 7-18, E 19,
// T 20, a 21, R 22, M 23, Record Count 24-31. Then Nonce (64), Key ID (8),
// Algorithm ID (8), Authentication Data Length (16), Authentication Data,
// the records, and when I is set the xTR-ID (128) and site-ID (64).
const (
	regP = 1 << 27
	regI = 1 << 25
	regT = 1 << 11
	regM = 1 << 8
)

// authOffset is where the authentication data starts in both messages.
const authOffset = 16

func encodeAuthMsg(msg string, word uint32, nonce uint64, keyID uint8, alg AlgorithmID, auth []byte, recs []Record, x *XTRID) ([]byte, error) {
	if n := len(recs); n < 1 || n > 255 {
		return nil, fmt.Errorf("%s: %d records: want 1 to 255", msg, n)
	}
	if len(auth) > 0xffff {
		return nil, fmt.Errorf("%s: %d bytes of authentication data: over the 16-bit length", msg, len(auth))
	}
	b := binary.BigEndian.AppendUint32(make([]byte, 0, 128), word|uint32(len(recs)))
	b = binary.BigEndian.AppendUint64(b, nonce)
	b = append(b, keyID, uint8(alg))
	b = binary.BigEndian.AppendUint16(b, uint16(len(auth)))
	b = append(b, auth...)
	for i, rec := range recs {
		var err error
		if b, err = appendRecord(b, rec); err != nil {
			return nil, fmt.Errorf("%s: record %d: %w", msg, i, err)
		}
	}
	if x != nil {
		b = append(b, x.ID[:]...)
		b = binary.BigEndian.AppendUint64(b, x.SiteID)
	}
	if len(b) > MaxMessageLen {
		return nil, fmt.Errorf("%s: %d bytes: over the %d-byte limit", msg, len(b), MaxMessageLen)
	}
	return b, nil
}

func (m *MapRegister) word() uint32 {
	w := uint32(TypeMapRegister) << 28
	for _, f := range []struct {
		on  bool
		bit uint32
	}{{m.ProxyReply, regP}, {m.XTRID != nil, regI}, {m.UseTTL, regT}, {m.WantMapNotify, regM}} {
		if f.on {
			w |= f.bit
		}
	}
	return w
}

// Encode writes the message with AuthData as it is; Seal fills it in.
func (m *MapRegister) Encode() ([]byte, error) {
	return encodeAuthMsg("map-register", m.word(), m.Nonce, m.KeyID, m.AlgorithmID, m.AuthData, m.Records, m.XTRID)
}

// Seal authenticates the message with HMAC-SHA-256-128 under key (the
// site's shared secret, known to the map-server as keyID): it sets KeyID,
// AlgorithmID and AuthData and returns the bytes to send.
func (m *MapRegister) Seal(keyID uint8, key []byte) ([]byte, error) {
	m.KeyID, m.AlgorithmID, m.AuthData = keyID, AlgHMACSHA256_128, make([]byte, AuthLen)
	b, err := m.Encode()
	if err != nil {
		return nil, err
	}
	m.AuthData = sealBytes(b, m.XTRID != nil, key)
	return b, nil
}

// Encode writes the message with AuthData as it is; Seal fills it in.
func (m *MapNotify) Encode() ([]byte, error) {
	t, msg := TypeMapNotify, "map-notify"
	if m.Ack {
		t, msg = TypeMapNotifyAck, "map-notify-ack"
	}
	return encodeAuthMsg(msg, uint32(t)<<28, m.Nonce, m.KeyID, m.AlgorithmID, m.AuthData, m.Records, nil)
}

// Seal authenticates the message as MapRegister.Seal does.
func (m *MapNotify) Seal(keyID uint8, key []byte) ([]byte, error) {
	m.KeyID, m.AlgorithmID, m.AuthData = keyID, AlgHMACSHA256_128, make([]byte, AuthLen)
	b, err := m.Encode()
	if err != nil {
		return nil, err
	}
	m.AuthData = sealBytes(b, false, key)
	return b, nil
}

// sealBytes writes the MAC into b (encoded with zeroed authentication
// data) and returns a copy of it.
func sealBytes(b []byte, hasXTRID bool, key []byte) []byte {
	mac := computeMAC(authRegion(b, hasXTRID), key)
	copy(b[authOffset:], mac)
	return mac
}

// authRegion is what RFC 9301 §5.6 authenticates: the message from its
// type field through the end of the last record, the xTR-ID and site-ID
// left out.
func authRegion(b []byte, hasXTRID bool) []byte {
	if hasXTRID {
		return b[:len(b)-xtrIDLen]
	}
	return b
}

// computeMAC is HMAC-SHA-256 over region with its authentication data
// taken as zeros, truncated to AuthLen bytes (RFC 4868 §2.6).
func computeMAC(region, key []byte) []byte {
	h := hmac.New(sha256.New, key)
	h.Write(region[:authOffset])
	h.Write(make([]byte, AuthLen))
	h.Write(region[authOffset+AuthLen:])
	return h.Sum(nil)[:AuthLen]
}

// Authenticate checks the authentication data of the Map-Register or
// Map-Notify b (as it arrived) against key: ErrNoAuth, ErrUnsupportedAlgorithm,
// ErrBadAuth, or a decoding *Error. The comparison takes the same time
// wherever the first differing byte is.
func Authenticate(b []byte, key []byte) error {
	t, err := MessageType(b)
	if err != nil {
		return err
	}
	var alg AlgorithmID
	var auth []byte
	hasXTRID := false
	switch t {
	case TypeMapRegister:
		m, err := DecodeMapRegister(b)
		if err != nil {
			return err
		}
		alg, auth, hasXTRID = m.AlgorithmID, m.AuthData, m.XTRID != nil
	case TypeMapNotify, TypeMapNotifyAck:
		m, err := DecodeMapNotify(b)
		if err != nil {
			return err
		}
		alg, auth = m.AlgorithmID, m.AuthData
	default:
		return &Error{Message: t.String(), Field: "type", Reason: "only a Map-Register or Map-Notify carries authentication data"}
	}
	switch {
	case alg == AlgNone && len(auth) == 0:
		return ErrNoAuth
	case alg != AlgHMACSHA256_128:
		return fmt.Errorf("%w: algorithm %d", ErrUnsupportedAlgorithm, alg)
	case len(auth) != AuthLen:
		return fmt.Errorf("%w: %d bytes of HMAC-SHA-256-128 data, want %d", ErrBadAuth, len(auth), AuthLen)
	}
	if !hmac.Equal(computeMAC(authRegion(b, hasXTRID), key), auth) {
		return ErrBadAuth
	}
	return nil
}

type authHeader struct {
	word        uint32
	nonce       uint64
	keyID       uint8
	alg         AlgorithmID
	auth        []byte
	records     []Record
	recordsFrom int
}

func decodeAuthMsg(r *reader, w uint32) (authHeader, error) {
	h := authHeader{word: w}
	count := int(w & 0xff)
	if count == 0 {
		return h, r.fail("record count", 3, "0 records: want at least one")
	}
	var err error
	if h.nonce, err = r.u64("nonce"); err != nil {
		return h, err
	}
	if h.keyID, err = r.u8("key id"); err != nil {
		return h, err
	}
	alg, err := r.u8("algorithm id")
	if err != nil {
		return h, err
	}
	h.alg = AlgorithmID(alg)
	lenAt := r.off
	n, err := r.u16("authentication data length")
	if err != nil {
		return h, err
	}
	if h.alg == AlgNone && n != 0 {
		return h, r.fail("authentication data length", lenAt, "%d bytes of authentication data with algorithm 0 (none)", n)
	}
	if err := r.need(int(n), "authentication data"); err != nil {
		return h, r.fail("authentication data length", lenAt, "%d bytes announced, %d left in the message", n, len(r.b)-r.off)
	}
	if n > 0 {
		h.auth = append([]byte(nil), r.b[r.off:r.off+int(n)]...)
	}
	r.off += int(n)
	h.recordsFrom = r.off
	h.records = make([]Record, 0, count)
	for i := range count {
		rec, err := r.record(fmt.Sprintf("record %d", i))
		if err != nil {
			return h, err
		}
		h.records = append(h.records, rec)
	}
	return h, nil
}

// DecodeMapRegister reads a Map-Register. It does not check the
// authentication data: Authenticate does, with the site's key.
func DecodeMapRegister(b []byte) (MapRegister, error) {
	var m MapRegister
	r, w, err := header(b, "map-register", TypeMapRegister)
	if err != nil {
		return m, err
	}
	h, err := decodeAuthMsg(r, w)
	if err != nil {
		return m, err
	}
	m = MapRegister{Nonce: h.nonce, ProxyReply: w&regP != 0, UseTTL: w&regT != 0, WantMapNotify: w&regM != 0,
		KeyID: h.keyID, AlgorithmID: h.alg, AuthData: h.auth, Records: h.records}
	if w&regI != 0 {
		if err := r.need(xtrIDLen, "xtr-id"); err != nil {
			return MapRegister{}, err
		}
		x := &XTRID{ID: [16]byte(r.b[r.off : r.off+16]), SiteID: binary.BigEndian.Uint64(r.b[r.off+16:])}
		r.off += xtrIDLen
		m.XTRID = x
	}
	if err := r.end(); err != nil {
		return MapRegister{}, err
	}
	return m, nil
}

// DecodeMapNotify reads a Map-Notify or Map-Notify-Ack. It does not check
// the authentication data: Authenticate does.
func DecodeMapNotify(b []byte) (MapNotify, error) {
	var m MapNotify
	r, w, err := header(b, "map-notify", TypeMapNotify, TypeMapNotifyAck)
	if err != nil {
		return m, err
	}
	h, err := decodeAuthMsg(r, w)
	if err != nil {
		return m, err
	}
	if err := r.end(); err != nil {
		return m, err
	}
	return MapNotify{Nonce: h.nonce, Ack: Type(w>>28) == TypeMapNotifyAck, KeyID: h.keyID, AlgorithmID: h.alg,
		AuthData: h.auth, Records: h.records}, nil
}
