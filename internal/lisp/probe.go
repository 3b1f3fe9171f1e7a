package lisp

import (
	"fmt"
	"net/netip"
)

// MaxProbeReplyLen bounds an RLOC-probe reply (RFC 9301 §7.1): one record
// of at most 8 IPv4 locators is 124 bytes and of 8 IPv6 ones 220; an
// answer that would be larger is not sent, so an unauthenticated probe
// from a forged source never draws out more than this.
const MaxProbeReplyLen = 256

// NewProbe returns the RLOC probe (RFC 9301 §7.1): a Map-Request with the P
// bit for eid, sent to the locator itself; itr is the prober's own RLOC
// (where the answer goes) and nonce is what the reply must echo.
func NewProbe(nonce uint64, itr netip.Addr, eid netip.Prefix) MapRequest {
	return MapRequest{Nonce: nonce, Probe: true, ITRRLOCs: []netip.Addr{itr}, EIDs: []netip.Prefix{eid}}
}

// AnswerProbe builds the reply an ETR owning the locator probed gives to
// the probe req: a Map-Reply with the P bit, the nonce echoed, and the one
// served record that covers the first EID asked about, its locators
// flagged L (the ETR's own), R (up), and p on probed (the locator the probe
// was sent to). It refuses (error) a request that is not a probe, an EID
// none of served covers, and an answer over MaxProbeReplyLen.
func AnswerProbe(req MapRequest, served []Record, probed netip.Addr) ([]byte, error) {
	if !req.Probe {
		return nil, fmt.Errorf("rloc probe: the map-request has no P bit")
	}
	if len(req.EIDs) == 0 {
		return nil, fmt.Errorf("rloc probe: no EID asked about")
	}
	want := req.EIDs[0]
	best := -1
	for i, r := range served {
		if r.EID.Bits() <= want.Bits() && r.EID.Contains(want.Addr()) && (best < 0 || r.EID.Bits() > served[best].EID.Bits()) {
			best = i
		}
	}
	if best < 0 {
		return nil, fmt.Errorf("rloc probe: %s is not an EID this ETR serves", want)
	}
	rec := served[best].Clone()
	for i := range rec.Locators {
		l := &rec.Locators[i]
		l.Local, l.Reachable, l.Probed = true, true, l.Addr == probed
	}
	rep := MapReply{Nonce: req.Nonce, Probe: true, Records: []Record{rec}}
	b, err := rep.Encode()
	if err != nil {
		return nil, fmt.Errorf("rloc probe: %w", err)
	}
	if len(b) > MaxProbeReplyLen {
		return nil, fmt.Errorf("rloc probe: the answer for %s is %d bytes, over the %d-byte bound", rec.EID, len(b), MaxProbeReplyLen)
	}
	return b, nil
}
