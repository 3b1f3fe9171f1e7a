package lisp

import (
	"encoding/binary"
	"net/netip"
	"strings"
	"testing"
	"time"
)

// A probe round-trips with its P bit and nonce; the answer echoes the
// nonce with the reply's P bit, carries the covering record with the probed
// locator flagged p, and its first word has P (bit 4) set on the wire.
func TestProbeAndItsAnswerRoundTrip(t *testing.T) {
	eid := netip.MustParsePrefix("10.88.0.0/24")
	req := NewProbe(0x0123456789abcdef, netip.MustParseAddr("192.168.71.1"), eid)
	b, err := req.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if b[0] != 0x12 { // type 1, P (0x02 of the first byte)
		t.Fatalf("first byte %#x, want 0x12 (map-request with P)", b[0])
	}
	got, err := DecodeMapRequest(b)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Probe || got.Nonce != req.Nonce || got.EIDs[0] != eid || got.ITRRLOCs[0] != req.ITRRLOCs[0] {
		t.Fatalf("decoded %+v, want %+v", got, req)
	}
	served := []Record{
		{EID: netip.MustParsePrefix("10.0.0.0/8"), TTL: time.Minute, Locators: []Locator{{Addr: netip.MustParseAddr("192.0.2.9"), Priority: 1}}},
		{EID: eid, TTL: 10 * time.Minute, Authoritative: true, Locators: []Locator{
			{Addr: netip.MustParseAddr("192.168.71.2"), Priority: 1, Weight: 50},
			{Addr: netip.MustParseAddr("192.168.72.2"), Priority: 1, Weight: 50},
		}},
	}
	ans, err := AnswerProbe(got, served, netip.MustParseAddr("192.168.72.2"))
	if err != nil {
		t.Fatal(err)
	}
	if ans[0] != 0x28 { // type 2, P (0x08 of the first byte)
		t.Fatalf("first byte %#x, want 0x28 (map-reply with P)", ans[0])
	}
	if n := binary.BigEndian.Uint64(ans[4:]); n != req.Nonce {
		t.Fatalf("nonce on the wire %#x, want %#x", n, req.Nonce)
	}
	rep, err := DecodeMapReply(ans)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Probe || rep.Nonce != req.Nonce || len(rep.Records) != 1 || rep.Records[0].EID != eid {
		t.Fatalf("answer %+v: want P, the nonce, the /24 (the longest covering prefix)", rep)
	}
	ls := rep.Records[0].Locators
	if len(ls) != 2 || ls[0].Probed || !ls[1].Probed || !ls[0].Local || !ls[0].Reachable {
		t.Fatalf("locators %+v: want both L and R, p on 192.168.72.2 only", ls)
	}
	if served[1].Locators[1].Probed {
		t.Fatal("AnswerProbe changed the served record")
	}
}

// An answer is refused for what is not a probe, an EID not served, and a
// record whose answer would exceed MaxProbeReplyLen (no amplification).
func TestAnswerProbeRefusesNonProbesUnservedEIDsAndLargeAnswers(t *testing.T) {
	eid := netip.MustParsePrefix("10.88.0.0/24")
	served := []Record{{EID: eid, TTL: time.Minute, Locators: []Locator{{Addr: netip.MustParseAddr("192.168.71.2"), Priority: 1}}}}
	probe := NewProbe(1, netip.MustParseAddr("192.168.71.1"), eid)
	plain := probe
	plain.Probe = false
	if _, err := AnswerProbe(plain, served, netip.Addr{}); err == nil || !strings.Contains(err.Error(), "P bit") {
		t.Fatalf("a plain map-request: %v, want a refusal naming the P bit", err)
	}
	other := NewProbe(1, netip.MustParseAddr("192.168.71.1"), netip.MustParsePrefix("10.99.0.0/24"))
	if _, err := AnswerProbe(other, served, netip.Addr{}); err == nil || !strings.Contains(err.Error(), "10.99.0.0/24") {
		t.Fatalf("an unserved EID: %v, want a refusal naming it", err)
	}
	wider := NewProbe(1, netip.MustParseAddr("192.168.71.1"), netip.MustParsePrefix("10.88.0.0/16"))
	if _, err := AnswerProbe(wider, served, netip.Addr{}); err == nil {
		t.Fatal("a prefix wider than the one served was answered")
	}
	big := served[0].Clone()
	for i := range 20 {
		big.Locators = append(big.Locators, Locator{Addr: netip.AddrFrom4([4]byte{192, 0, 2, byte(i)}), Priority: 1})
	}
	if _, err := AnswerProbe(probe, []Record{big}, netip.Addr{}); err == nil || !strings.Contains(err.Error(), "bound") {
		t.Fatalf("a 21-locator answer: %v, want a refusal over the bound", err)
	}
}
