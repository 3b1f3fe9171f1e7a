// Package lisp is the Locator/ID Separation Protocol as onehop uses it, as
// pure logic plus two small UDP clients: the data-plane header of RFC 9300
// (UDP 4341); the control-plane messages of RFC 9301 (UDP 4342: Map-Request,
// Map-Reply, Map-Register, Map-Notify, and the Encapsulated Control Message
// that carries a Map-Request to a map-resolver) with their EID records and
// locators; Map-Register/Map-Notify authentication (HMAC-SHA-256-128); a
// map-resolver client that caches by record TTL (Resolver) and the registrar
// an xTR runs (Registrar). The map-server's logic is here too: Answer picks
// the record for an EID from the mappings held (or the negative one), and
// Site, ParseSites and Authorize decide who may register what; the
// controller keeps the mappings in etcd and serves them.
//
// Every decoder refuses short, oversized, wrong-type, wrong-AFI and
// inconsistent input with an *Error naming the message, the field and the
// byte offset. docs/cloud-access.md ("Mapping system") lays out every message
// byte by byte.
package lisp

import (
	"fmt"
	"net/netip"
	"slices"
	"time"
)

// The well-known ports (RFC 9300 §5.3, RFC 9301 §5).
const (
	DataPort    = 4341 // encapsulated data packets
	ControlPort = 4342 // Map-Request, Map-Reply, Map-Register, Map-Notify
)

// UnusablePriority is the locator priority that means "do not use this RLOC
// for unicast" (RFC 9301 §5.4, Priority).
const UnusablePriority = 255

// MaxMessageLen is the largest control message this package encodes or
// accepts. RFC 9301 bounds a message only by UDP; onehop's fabric carries
// 1500-byte frames and its messages are far smaller, so anything above this
// is refused as oversized rather than read.
const MaxMessageLen = 8192

// AFIs (IANA Address Family Numbers) this package reads and writes. Any
// other, LCAF (16387) included, is refused by name.
const (
	AFINone uint16 = 0 // "no address" (Map-Request Source-EID only)
	AFIIPv4 uint16 = 1
	AFIIPv6 uint16 = 2
)

// Action is a record's ACT field: what an ITR does with packets for an EID
// that has no usable locator (RFC 9301 §5.4; IANA "LISP ACT Values").
type Action uint8

// The actions.
const (
	ActionNoAction         Action = 0 // keep the cache entry, do not encapsulate
	ActionNativelyForward  Action = 1 // forward without encapsulation (a non-LISP destination)
	ActionSendMapRequest   Action = 2 // send a Map-Request
	ActionDrop             Action = 3 // Drop/No-Reason
	ActionDropPolicyDenied Action = 4 // Drop/Policy-Denied
	ActionDropAuthFailure  Action = 5 // Drop/Authentication-Failure
)

var actionNames = []string{"no-action", "native-forward", "send-map-request", "drop", "drop-policy-denied", "drop-auth-failure"}

// String names the action as the CLI and REST API spell it.
func (a Action) String() string {
	if int(a) < len(actionNames) {
		return actionNames[a]
	}
	return fmt.Sprintf("action-%d", uint8(a))
}

// ParseAction is String's inverse.
func ParseAction(s string) (Action, error) {
	if i := slices.Index(actionNames, s); i >= 0 {
		return Action(i), nil
	}
	return 0, fmt.Errorf("unknown action %q: want one of %v", s, actionNames)
}

// Valid reports whether the 3-bit field has an assigned value.
func (a Action) Valid() bool { return int(a) < len(actionNames) }

// MarshalText writes the action's name.
func (a Action) MarshalText() ([]byte, error) { return []byte(a.String()), nil }

// UnmarshalText reads an action's name.
func (a *Action) UnmarshalText(b []byte) error {
	v, err := ParseAction(string(b))
	if err != nil {
		return err
	}
	*a = v
	return nil
}

// Locator is one RLOC of an EID record (RFC 9301 §5.4).
type Locator struct {
	Addr      netip.Addr `json:"addr"`
	Priority  uint8      `json:"priority"` // lower is preferred; 255 = unusable for unicast
	Weight    uint8      `json:"weight"`   // share among locators of equal priority
	MPriority uint8      `json:"mPriority"`
	MWeight   uint8      `json:"mWeight"`
	Local     bool       `json:"local,omitempty"`     // L: the locator is the sender's own
	Probed    bool       `json:"probed,omitempty"`    // p: the reply answers an RLOC probe to this locator
	Reachable bool       `json:"reachable,omitempty"` // R: the locator is up
}

// Usable reports whether an ITR may send unicast to this locator.
func (l Locator) Usable() bool { return l.Priority != UnusablePriority }

// Record is an EID-to-RLOC mapping as Map-Reply, Map-Register and
// Map-Notify carry it. A record with no locators is negative: Action says
// what to do with the EID's packets.
type Record struct {
	EID           netip.Prefix  `json:"eid"`
	TTL           time.Duration `json:"ttl"` // on the wire in whole minutes
	Action        Action        `json:"action"`
	Authoritative bool          `json:"authoritative"`
	MapVersion    uint16        `json:"mapVersion,omitempty"` // 12 bits; 0 = not versioned
	Locators      []Locator     `json:"locators"`
}

// Negative reports whether the record has no locators.
func (r Record) Negative() bool { return len(r.Locators) == 0 }

// Usable returns the locators an ITR may send unicast to (priority below
// 255), best priority first and, within a priority, heaviest weight first;
// ties keep the record's order.
func (r Record) Usable() []Locator {
	var out []Locator
	for _, l := range r.Locators {
		if l.Usable() {
			out = append(out, l)
		}
	}
	slices.SortStableFunc(out, func(a, b Locator) int {
		if a.Priority != b.Priority {
			return int(a.Priority) - int(b.Priority)
		}
		return int(b.Weight) - int(a.Weight)
	})
	return out
}

// Clone returns a copy sharing no memory with r.
func (r Record) Clone() Record {
	r.Locators = slices.Clone(r.Locators)
	return r
}

// Validate checks what the wire format cannot carry: a canonical EID prefix
// of IPv4 or IPv6, a TTL of whole minutes, an assigned action, a 12-bit map
// version, at most 255 locators of IPv4 or IPv6.
func (r Record) Validate() error {
	if !r.EID.IsValid() {
		return fmt.Errorf("eid: missing or invalid prefix")
	}
	if r.EID.Addr().Is4In6() || r.EID.Addr().Zone() != "" {
		return fmt.Errorf("eid %s: want a plain IPv4 or IPv6 prefix", r.EID)
	}
	if r.EID.Masked() != r.EID {
		return fmt.Errorf("eid %s: host bits set (want %s)", r.EID, r.EID.Masked())
	}
	if _, err := ttlMinutes(r.TTL); err != nil {
		return err
	}
	if !r.Action.Valid() {
		return fmt.Errorf("action %d: unassigned (want 0-5)", r.Action)
	}
	if r.MapVersion > 0xfff {
		return fmt.Errorf("map version %d: over the 12-bit field's 4095", r.MapVersion)
	}
	if len(r.Locators) > 255 {
		return fmt.Errorf("%d locators: the count field holds 255", len(r.Locators))
	}
	for i, l := range r.Locators {
		if !l.Addr.IsValid() || l.Addr.Is4In6() || l.Addr.Zone() != "" {
			return fmt.Errorf("locator %d: %q is not a plain IPv4 or IPv6 address", i, l.Addr)
		}
	}
	return nil
}

func ttlMinutes(d time.Duration) (uint32, error) {
	switch {
	case d < 0:
		return 0, fmt.Errorf("ttl %s: negative", d)
	case d%time.Minute != 0:
		return 0, fmt.Errorf("ttl %s: the record TTL is in whole minutes", d)
	case d/time.Minute > 0xffffffff:
		return 0, fmt.Errorf("ttl %s: over the 32-bit minute count", d)
	}
	return uint32(d / time.Minute), nil
}
