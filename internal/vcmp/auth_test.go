package vcmp

import (
	"bytes"
	"crypto/ecdh"
	"crypto/rand"
	"errors"
	"testing"
)

// RFC 7748 §6.1 X25519 test keys: Alice is the client, Bob the server.
const (
	alicePriv = "77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a"
	alicePub  = "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a"
	bobPriv   = "5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb"
	bobPub    = "de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f"
)

func x25519(t *testing.T, h string) *ecdh.PrivateKey {
	t.Helper()
	k, err := ecdh.X25519().NewPrivateKey(unhex(t, h))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestDeriveKeysKnownAnswer pins the derivation: the RFC 7748 keys, the
// paper's §4.1 connection, and HKDF-SHA-256 outputs computed independently
// (Python's hmac module) from the info layout docs/vcmp.md gives.
func TestDeriveKeysKnownAnswer(t *testing.T) {
	a, b := x25519(t, alicePriv), x25519(t, bobPriv)
	if pa := PublicKey(a); !bytes.Equal(pa[:], unhex(t, alicePub)) {
		t.Fatalf("alice's public key %x", pa)
	}
	ka, err := DeriveKeys(a, [32]byte(unhex(t, bobPub)), clientConn)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := DeriveKeys(b, [32]byte(unhex(t, alicePub)), serverConn)
	if err != nil {
		t.Fatal(err)
	}
	clientToServer := unhex(t, "0fa2e3651d8194a02c6d436aa5547a196a5db189655bf846b29c5b680713d402")
	serverToClient := unhex(t, "c7af76622a0d50d9aade62d2515191fc0e927cd9c266f50bee7a482cc6c97181")
	if !bytes.Equal(ka.Send[:], clientToServer) || !bytes.Equal(kb.Recv[:], clientToServer) {
		t.Errorf("client->server key: client sends with %x, server receives with %x, want %x", ka.Send, kb.Recv, clientToServer)
	}
	if !bytes.Equal(kb.Send[:], serverToClient) || !bytes.Equal(ka.Recv[:], serverToClient) {
		t.Errorf("server->client key: server sends with %x, client receives with %x, want %x", kb.Send, ka.Recv, serverToClient)
	}
}

func TestKeysAreBoundToTheConnection(t *testing.T) {
	a, b := x25519(t, alicePriv), x25519(t, bobPriv)
	base, err := DeriveKeys(a, PublicKey(b), clientConn)
	if err != nil {
		t.Fatal(err)
	}
	others := []Tuple{
		{UDP, client, server},
		{TCP, ap("10.10.10.10:40001"), server},
		{TCP, client, ap("20.20.20.20:23")},
		{TCP, ap("10.10.10.11:40000"), server},
		{TCP, client, ap("20.20.20.21:22")},
	}
	for _, o := range others {
		k, err := DeriveKeys(a, PublicKey(b), o)
		if err != nil {
			t.Fatal(err)
		}
		if k.Send == base.Send || k.Recv == base.Recv || k.Send == base.Recv {
			t.Errorf("connection %v derives a key of %v", o, clientConn)
		}
	}
	if base.Send == base.Recv {
		t.Error("both directions share one key: a sealed update could be reflected to its sender")
	}
}

func TestDeriveKeysRandomPairsAgree(t *testing.T) {
	a, err := GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	b, err := GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ka, err := DeriveKeys(a, PublicKey(b), clientConn)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := DeriveKeys(b, PublicKey(a), serverConn)
	if err != nil {
		t.Fatal(err)
	}
	if ka.Send != kb.Recv || ka.Recv != kb.Send {
		t.Fatal("the two ends derived different keys")
	}
}

func TestDeriveKeysRejectsLowOrderPeerKey(t *testing.T) {
	a := x25519(t, alicePriv)
	if _, err := DeriveKeys(a, [32]byte{}, clientConn); err == nil {
		t.Fatal("the all-zero (low-order) public key was accepted")
	}
	if _, err := DeriveKeys(a, PublicKey(a), Tuple{Proto: TCP, Local: client}); err == nil {
		t.Fatal("a connection with no remote end was accepted")
	}
}

// TestSealKnownAnswer: the tag is HMAC-SHA-256 over the exact bytes before
// it, checked against a tag computed outside Go (Python's hmac).
func TestSealKnownAnswer(t *testing.T) {
	var key Secret
	for i := range key {
		key[i] = byte(i + 1)
	}
	s, err := Seal(&Update{Record{Conn: clientConn, Phys: ap("30.30.30.30:40001")}}, key, 42)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Encode(s)
	if err != nil {
		t.Fatal(err)
	}
	want := unhex(t, "01 09 00 44 | 00 00 00 00 | 00 00 00 2a |"+
		"01 03 00 18 | 00 16 06 00 | 14 14 14 14 | 0a 0a 0a 0a | 1e 1e 1e 1e | 9c 40 9c 41 |"+
		"93db1dae98723d4fd09280ec4af018336bf8d63bd85927a92b0ab2c0a6d47d9b")
	if !bytes.Equal(got, want) {
		t.Fatalf("sealed:\n got %x\nwant %x", got, want)
	}
	if _, err := Seal(s.Inner, key, 0); err == nil {
		t.Fatal("sequence number 0 was sealed")
	}
	if _, err := Seal(&LocStore{Record{Conn: clientConn, Phys: client}}, key, 1); err == nil {
		t.Fatal("a LOC_STORE was sealed")
	}
}

// keyedPair is a client and server that agreed keys.
func keyedPair(t *testing.T) (clientKeys, serverKeys Keys) {
	t.Helper()
	a, b := x25519(t, alicePriv), x25519(t, bobPriv)
	ka, err := DeriveKeys(a, PublicKey(b), clientConn)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := DeriveKeys(b, PublicKey(a), serverConn)
	if err != nil {
		t.Fatal(err)
	}
	return ka, kb
}

// wire seals, encodes and decodes, as the daemon would between two ends.
func wire(t *testing.T, m Message, key Secret, seq uint64) Message {
	t.Helper()
	s, err := Seal(m, key, seq)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Encode(s)
	if err != nil {
		t.Fatal(err)
	}
	d, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestOpenAcceptsAndRejects(t *testing.T) {
	ck, sk := keyedPair(t)
	update := &Update{Record{Conn: clientConn, Phys: ap("30.30.30.30:40001")}}
	hijack := &Update{Record{Conn: clientConn, Phys: ap("66.66.66.66:4444")}}
	var attackerKey Secret
	attackerKey[0] = 1

	tamper := func(m Message, at int) Message {
		b, err := Encode(m)
		if err != nil {
			t.Fatal(err)
		}
		b[at] ^= 0x01
		d, err := Decode(b)
		if err != nil {
			t.Fatalf("the tampered message does not decode: %v", err)
		}
		return d
	}
	good := wire(t, update, ck.Send, 1)

	cases := []struct {
		name     string
		msgs     []Message // opened in order; all but the last must pass
		key      *Secret
		require  bool
		want     error
		wantPeer string
	}{
		{"sealed update opens", []Message{good}, &sk.Recv, false, nil, "30.30.30.30:40001"},
		{"plain update, no keys, keys not required", []Message{update}, nil, false, nil, "30.30.30.30:40001"},
		{"plain update with keys required", []Message{update}, nil, true, ErrUnkeyed, ""},
		{"plain update for a keyed connection (downgrade)", []Message{hijack}, &sk.Recv, false, ErrUnkeyed, ""},
		{"sealed update for an unkeyed connection", []Message{good}, nil, false, ErrNoKey, ""},
		{"forged: sealed with another key", []Message{wire(t, hijack, attackerKey, 1)}, &sk.Recv, false, ErrForged, ""},
		{"forged: physical address flipped", []Message{tamper(good, 12+16)}, &sk.Recv, false, ErrForged, ""},
		{"forged: physical port flipped", []Message{tamper(good, 12+23)}, &sk.Recv, false, ErrForged, ""},
		{"forged: sequence number flipped", []Message{tamper(good, 11)}, &sk.Recv, false, ErrForged, ""},
		{"forged: tag flipped", []Message{tamper(good, 12+24+31)}, &sk.Recv, false, ErrForged, ""},
		{"forged: reflected to its sender", []Message{good}, &ck.Recv, false, ErrForged, ""},
		{"replayed: same update twice", []Message{good, good}, &sk.Recv, false, ErrReplayed, ""},
		{"replayed: older than the last", []Message{wire(t, update, ck.Send, 5), wire(t, update, ck.Send, 5)}, &sk.Recv, false, ErrReplayed, ""},
		{"late but fresh: 4 after 5", []Message{wire(t, update, ck.Send, 5), wire(t, update, ck.Send, 4)}, &sk.Recv, false, nil, "30.30.30.30:40001"},
		{"too old: 1 after 100", []Message{wire(t, update, ck.Send, 100), wire(t, update, ck.Send, 1)}, &sk.Recv, false, ErrReplayed, ""},
		{"not an update", []Message{&LocStore{Record{Conn: clientConn, Phys: client}}}, &sk.Recv, false, nil, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var w Window
			var got Message
			var err error
			for i, m := range c.msgs {
				got, err = Open(m, c.key, &w, c.require)
				if i < len(c.msgs)-1 && err != nil {
					t.Fatalf("message %d of %d refused: %v", i+1, len(c.msgs), err)
				}
			}
			if c.name == "not an update" {
				if err == nil {
					t.Fatal("a LOC_STORE was opened as an update")
				}
				return
			}
			if !errors.Is(err, c.want) {
				t.Fatalf("error %v, want %v", err, c.want)
			}
			if c.want == nil && got.(*Update).Phys.String() != c.wantPeer {
				t.Fatalf("opened %#v, want the peer at %s", got, c.wantPeer)
			}
		})
	}
}

func TestForgedUpdateDoesNotMoveTheWindow(t *testing.T) {
	ck, sk := keyedPair(t)
	var attacker Secret
	update := &Update{Record{Conn: clientConn, Phys: ap("30.30.30.30:40001")}}
	var w Window
	if _, err := Open(wire(t, update, attacker, 1000), &sk.Recv, &w, true); !errors.Is(err, ErrForged) {
		t.Fatalf("forged update: %v", err)
	}
	if w.Top() != 0 {
		t.Fatalf("a forged update moved the window to %d", w.Top())
	}
	if _, err := Open(wire(t, update, ck.Send, 1), &sk.Recv, &w, true); err != nil {
		t.Fatalf("the genuine first update after a forged one: %v", err)
	}
}

func TestWindow(t *testing.T) {
	var w Window
	accept := func(seq uint64) error {
		if err := w.Check(seq); err != nil {
			return err
		}
		w.Accept(seq)
		return nil
	}
	steps := []struct {
		seq uint64
		ok  bool
	}{
		{0, false}, {1, true}, {1, false}, {3, true}, {2, true}, {2, false}, {3, false},
		{70, true}, {7, true}, {6, false}, // 70-6 = 64: outside the window
		{7, false}, {69, true}, {200, true}, {137, true}, {136, false}, {200, false},
		{^uint64(0), true}, {^uint64(0), false}, {^uint64(0) - 63, true}, {^uint64(0) - 64, false},
	}
	for i, s := range steps {
		err := accept(s.seq)
		if (err == nil) != s.ok {
			t.Fatalf("step %d: seq %d: error %v, want accepted=%v", i, s.seq, err, s.ok)
		}
		if err != nil && !errors.Is(err, ErrReplayed) {
			t.Fatalf("step %d: error %v, want ErrReplayed", i, err)
		}
	}
}
