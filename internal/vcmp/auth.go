package vcmp

import (
	"bytes"
	"crypto/ecdh"
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Errors Open returns for an update it refuses. They are distinct so the
// daemon can count each kind (issue 10 item 6).
var (
	ErrForged   = errors.New("vcmp: update tag does not verify (forged or wrong key)")
	ErrReplayed = errors.New("vcmp: update sequence number already seen or too old (replayed)")
	ErrUnkeyed  = errors.New("vcmp: unauthenticated update where a key is required")
	ErrNoKey    = errors.New("vcmp: sealed update for a connection without a key")
)

// SecretLen is the size of a derived per-direction HMAC key.
const SecretLen = 32

// Secret is one direction's HMAC-SHA-256 key.
type Secret [SecretLen]byte

// Keys are a connection's two update keys: Send seals what this end sends,
// Recv opens what the peer sends. One end's Send is the other's Recv, so a
// message can never be reflected back to its sender and accepted.
type Keys struct {
	Send, Recv Secret
}

// GenerateKey makes a fresh X25519 key pair for one connection's suspension
// (paper §3.3.1.1, Diffie–Hellman on a modern curve). rand is normally
// crypto/rand.Reader.
func GenerateKey(rand io.Reader) (*ecdh.PrivateKey, error) {
	k, err := ecdh.X25519().GenerateKey(rand)
	if err != nil {
		return nil, fmt.Errorf("vcmp: generate x25519 key: %w", err)
	}
	return k, nil
}

// PublicKey returns the 32 bytes a VCMP_KEY message carries.
func PublicKey(priv *ecdh.PrivateKey) [KeyLen]byte {
	return [KeyLen]byte(priv.PublicKey().Bytes())
}

const hkdfSalt = "onehop vcmp v1 update keys"

// DeriveKeys agrees the connection's update keys from this end's private key
// and the peer's public key (from its VCMP_KEY). The X25519 shared secret is
// expanded with HKDF-SHA-256 into one key per direction; the info string
// binds each key to the virtual connection (protocol and both virtual
// endpoints), to both public keys and to the sending end, so a key agreed for
// one connection opens nothing on another.
func DeriveKeys(priv *ecdh.PrivateKey, peerPublic [KeyLen]byte, conn Tuple) (Keys, error) {
	if !conn.Local.Addr().Is4() || !conn.Remote.Addr().Is4() || !conn.Proto.valid() {
		return Keys{}, fmt.Errorf("vcmp: derive keys for %v: not an IPv4 tcp/udp connection", conn)
	}
	pub, err := ecdh.X25519().NewPublicKey(peerPublic[:])
	if err != nil {
		return Keys{}, fmt.Errorf("vcmp: derive keys for %v: peer public key: %w", conn, err)
	}
	shared, err := priv.ECDH(pub)
	if err != nil {
		// A low-order peer key yields the all-zero secret, which crypto/ecdh refuses.
		return Keys{}, fmt.Errorf("vcmp: derive keys for %v: x25519: %w", conn, err)
	}
	mine := PublicKey(priv)
	send, err := directionKey(shared, conn, conn.Local.Addr().As4(), conn.Local.Port(), mine, peerPublic)
	if err != nil {
		return Keys{}, err
	}
	recv, err := directionKey(shared, conn, conn.Remote.Addr().As4(), conn.Remote.Port(), mine, peerPublic)
	if err != nil {
		return Keys{}, err
	}
	return Keys{Send: send, Recv: recv}, nil
}

// directionKey is HKDF-SHA-256(shared, salt, info) where info is the sending
// end, then the connection and the public keys in an order both ends agree
// on (the lower virtual endpoint first).
func directionKey(shared []byte, conn Tuple, fromAddr [4]byte, fromPort uint16, a, b [KeyLen]byte) (Secret, error) {
	lo, hi := conn.Local, conn.Remote
	pa, pb := a, b
	if endpointLess(hi, lo) {
		lo, hi = hi, lo
		pa, pb = b, a
	}
	var info bytes.Buffer
	info.WriteString("from ")
	info.Write(fromAddr[:])
	info.Write(binary.BigEndian.AppendUint16(nil, fromPort))
	info.WriteByte(byte(conn.Proto))
	la, ha := lo.Addr().As4(), hi.Addr().As4()
	info.Write(la[:])
	info.Write(binary.BigEndian.AppendUint16(nil, lo.Port()))
	info.Write(ha[:])
	info.Write(binary.BigEndian.AppendUint16(nil, hi.Port()))
	info.Write(pa[:])
	info.Write(pb[:])
	k, err := hkdf.Key(sha256.New, shared, []byte(hkdfSalt), info.String(), SecretLen)
	if err != nil {
		return Secret{}, fmt.Errorf("vcmp: hkdf: %w", err)
	}
	return Secret(k), nil
}

// tag is HMAC-SHA-256 over a sealed message's bytes before the tag.
func tag(key Secret, signed []byte) [TagLen]byte {
	h := hmac.New(sha256.New, key[:])
	h.Write(signed)
	return [TagLen]byte(h.Sum(nil))
}

// Seal wraps an update or update reply into a VCMP_AUTH message with
// sequence number seq (never 0; the sender counts 1, 2, 3, ... per
// connection and direction) and its tag, computed over the exact bytes the
// peer will receive before the tag.
func Seal(inner Message, key Secret, seq uint64) (*Sealed, error) {
	if seq == 0 {
		return nil, fieldErr(CmdSealed, "Seq", 4, ErrField, "sequence number 0 is never valid")
	}
	s := &Sealed{Seq: seq, Inner: inner}
	b, err := Encode(s)
	if err != nil {
		return nil, err
	}
	s.Tag = tag(key, b[:len(b)-TagLen])
	return s, nil
}

// Open checks an update m as received for a connection and returns the
// update to apply. key and w are the connection's receive key and replay
// window, nil when no key was agreed. A sealed update must verify under key
// (ErrForged) and carry a fresh sequence number (ErrReplayed); only then does
// the window advance, so forged messages cannot move it. A plain update is
// refused (ErrUnkeyed) when the connection has a key — a downgrade — or when
// requireKeys is set; a sealed update for an unkeyed connection is refused
// with ErrNoKey.
func Open(m Message, key *Secret, w *Window, requireKeys bool) (Message, error) {
	switch m := m.(type) {
	case *Update, *UpdateReply:
		if key != nil || requireKeys {
			return nil, ErrUnkeyed
		}
		return m, nil
	case *Sealed:
		if key == nil || w == nil {
			return nil, ErrNoKey
		}
		// Decoding is strict and canonical (every accepted byte string
		// re-encodes to itself; FuzzDecode checks it), so the bytes encoded
		// here are the bytes that arrived.
		b, err := Encode(m)
		if err != nil {
			return nil, fmt.Errorf("vcmp: open: %w", err)
		}
		want := tag(*key, b[:len(b)-TagLen])
		if !hmac.Equal(want[:], m.Tag[:]) {
			return nil, ErrForged
		}
		if err := w.Check(m.Seq); err != nil {
			return nil, err
		}
		w.Accept(m.Seq)
		return m.Inner, nil
	case nil:
		return nil, errors.New("vcmp: open: nil message")
	}
	return nil, fmt.Errorf("vcmp: open: %s is not an update", m.Command())
}

// WindowSize is how far behind the highest sequence number seen a late
// update is still accepted once.
const WindowSize = 64

// Window is a connection's replay window for one direction, the sliding
// bitmap of RFC 4303 §3.4.3: a sequence number is accepted once, if it is
// above the highest seen or within WindowSize below it and not seen before.
// Strictly increasing would do on one TCP stream; the window also lets a
// daemon retry an update on a second stream without the retry being refused
// because a later one overtook it. The zero Window accepts 1 first.
type Window struct {
	top    uint64 // highest accepted sequence number, 0 before the first
	bitmap uint64 // bit i set: top-i was accepted
}

// Check reports whether seq would be accepted, without recording it.
func (w *Window) Check(seq uint64) error {
	switch {
	case seq == 0:
		return ErrReplayed
	case seq > w.top:
		return nil
	case w.top-seq >= WindowSize:
		return ErrReplayed
	case w.bitmap&(1<<(w.top-seq)) != 0:
		return ErrReplayed
	}
	return nil
}

// Accept records seq as seen; call it only after Check passed and the tag
// verified.
func (w *Window) Accept(seq uint64) {
	if seq > w.top {
		shift := seq - w.top
		if shift >= WindowSize {
			w.bitmap = 0
		} else {
			w.bitmap <<= shift
		}
		w.bitmap |= 1
		w.top = seq
		return
	}
	w.bitmap |= 1 << (w.top - seq)
}

// Top is the highest sequence number accepted so far.
func (w *Window) Top() uint64 { return w.top }
