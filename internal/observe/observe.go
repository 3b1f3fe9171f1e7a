// Package observe is onehop observe's pure part: the events a host
// publishes (drops, admitted flows, lost counts), the filter a viewer asks
// for, the subscription record that makes hosts publish, and the sealed
// datagrams that carry events from the hosts to the controller serving the
// stream (docs/troubleshooting.md, "observe").
package observe

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"
)

// Kinds of Event.
const (
	KindDrop = "drop" // a packet dropped, with its reason
	KindFlow = "flow" // a new flow admitted and remembered in conntrack
	KindLost = "lost" // Lost events of Farm that could not be shown
	// The ARP engine's (userspace): Dst is the VM asked about, HostMAC
	// the address asked (a scope's multicast group, or the VM's last known
	// host) or, answered, the host that holds it.
	KindARPQuestion = "arp_question"
	KindARPAnswer   = "arp_answer"
	// KindTapDropped: Copies copies of TAP policy Policy lost on Node
	// since the last such event (over its monitor's share, or a failed
	// clone), from the TAP counters each second. Farm 0: a TAP policy is
	// the operator's, and a tenant's stream must not learn its traffic is
	// copied.
	KindTapDropped = "tap_dropped"
)

// Where events were lost.
const (
	LostDatapath = "datapath" // over the farm's budget, or the host's ring full
	LostAgent    = "agent"    // the agent could not send them as fast as they came
	LostNetwork  = "network"  // sent by a host, never reached the controller
)

// Event is one thing a host saw, as the viewer gets it (-o json).
type Event struct {
	Time    time.Time `json:"time"`
	Node    string    `json:"node"`
	Kind    string    `json:"kind"`
	Farm    uint32    `json:"farm"` // whose budget it spent: the sending VM's farm (0: none)
	Reason  string    `json:"reason,omitempty"`
	Src     string    `json:"src,omitempty"`
	Dst     string    `json:"dst,omitempty"`
	Proto   string    `json:"proto,omitempty"`
	Sport   uint16    `json:"sport,omitempty"`
	Dport   uint16    `json:"dport,omitempty"`
	SrcMAC  string    `json:"src_mac,omitempty"`
	HostMAC string    `json:"host_mac,omitempty"`
	// Rule and RuleFarm, for a flow between subnets: the visibility rule
	// that admitted it (onehop rule list FARM), as the controller finds it.
	Rule      uint32 `json:"rule,omitempty"`
	RuleFarm  string `json:"rule_farm,omitempty"`
	Interface string `json:"interface,omitempty"`
	// Policy and Copies, for KindTapDropped: the TAP policy and how many
	// of its copies were lost.
	Policy string `json:"policy,omitempty"`
	Copies uint64 `json:"copies,omitempty"`
	// Lost and Where, for KindLost: how many events of Farm were not
	// shown since the last such event, and where they were lost.
	Lost  uint64 `json:"lost,omitempty"`
	Where string `json:"where,omitempty"`
}

// ProtoName names an IP protocol number as observe shows it.
func ProtoName(p uint8) string {
	switch p {
	case 0:
		return ""
	case 1:
		return "icmp"
	case 6:
		return "tcp"
	case 17:
		return "udp"
	}
	return fmt.Sprint(p)
}

// Filter is what a viewer asks to see; a zero field matches anything.
type Filter struct {
	Farm   uint32     `json:"farm,omitempty"`
	Addr   netip.Addr `json:"addr,omitzero"` // a VM's address: events from or to it
	Node   string     `json:"node,omitempty"`
	Reason string     `json:"reason,omitempty"`
}

// Match reports whether e is one the filter lets through. A lost count
// goes through whenever its farm and node do: the viewer must know what it
// may have missed.
func (f Filter) Match(e Event) bool {
	if f.Farm != 0 && e.Farm != f.Farm {
		return false
	}
	if f.Node != "" && e.Node != f.Node {
		return false
	}
	if e.Kind == KindLost {
		return true
	}
	if f.Reason != "" && e.Reason != f.Reason {
		return false
	}
	if f.Addr.IsValid() && e.Src != f.Addr.String() && e.Dst != f.Addr.String() {
		return false
	}
	return true
}

// Subscription is the record (intent.ObservePrefix + ID) that makes hosts
// publish, while one onehop observe runs: to Collector (the controller's
// UDP address), each datagram sealed with Key, only events of Farm (0:
// all) and only from Node (empty: every host).
type Subscription struct {
	ID        string `json:"id"`
	Collector string `json:"collector"`
	Key       []byte `json:"key"`
	Farm      uint32 `json:"farm,omitempty"`
	Node      string `json:"node,omitempty"`
}

// Datagram is what one UDP datagram from a host carries: Seq counts the
// host's datagrams of one subscription from 1, so the controller counts
// the ones that never came.
type Datagram struct {
	Sub    string  `json:"sub"`
	Node   string  `json:"node"`
	Seq    uint64  `json:"seq"`
	Events []Event `json:"events"`
}

// MaxDatagram bounds a sealed datagram: a host sends a batch before it
// grows past this.
const MaxDatagram = 8192

const macSize = sha256.Size

// Seal encodes d and appends its HMAC-SHA256 under key: the controller
// takes only what a host that read the subscription sent (anyone on the
// fabric can send UDP; only the hosts and the controller read the record).
func Seal(key []byte, d Datagram) ([]byte, error) {
	b, err := json.Marshal(d)
	if err != nil {
		return nil, fmt.Errorf("encode observe datagram: %w", err)
	}
	m := hmac.New(sha256.New, key)
	m.Write(b)
	return m.Sum(b), nil
}

// ErrUnsealed is a datagram whose seal does not match the key.
var ErrUnsealed = errors.New("observe datagram: bad seal")

// Open checks b's seal under key and decodes it.
func Open(key, b []byte) (Datagram, error) {
	var d Datagram
	if len(b) < macSize {
		return d, ErrUnsealed
	}
	body, sum := b[:len(b)-macSize], b[len(b)-macSize:]
	m := hmac.New(sha256.New, key)
	m.Write(body)
	if !hmac.Equal(m.Sum(nil), sum) {
		return d, ErrUnsealed
	}
	if err := json.Unmarshal(body, &d); err != nil {
		return d, fmt.Errorf("decode observe datagram: %w", err)
	}
	return d, nil
}

// Line is an event as one line of text (the default output).
func Line(e Event) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s farm %d %s", e.Time.Format("15:04:05.000"), e.Node, e.Farm, e.Kind)
	if e.Kind == KindLost {
		fmt.Fprintf(&b, " lost %d events (%s)", e.Lost, e.Where)
		return b.String()
	}
	if e.Kind == KindTapDropped {
		fmt.Fprintf(&b, " %d copies of tap policy %s dropped (its monitor's share, or a failed clone)", e.Copies, e.Policy)
		return b.String()
	}
	if e.Reason != "" {
		fmt.Fprintf(&b, " %s", e.Reason)
	}
	if e.Proto != "" {
		fmt.Fprintf(&b, " %s", e.Proto)
	}
	fmt.Fprintf(&b, " %s", hostPort(e.Src, e.Sport))
	fmt.Fprintf(&b, " -> %s", hostPort(e.Dst, e.Dport))
	if e.Interface != "" {
		fmt.Fprintf(&b, " on %s", e.Interface)
	}
	if e.SrcMAC != "" {
		fmt.Fprintf(&b, " from %s", e.SrcMAC)
	}
	if e.HostMAC != "" {
		fmt.Fprintf(&b, " host %s", e.HostMAC)
	}
	if e.Rule != 0 {
		fmt.Fprintf(&b, " by rule %d of %s", e.Rule, e.RuleFarm)
	}
	return b.String()
}

func hostPort(addr string, port uint16) string {
	if port == 0 {
		return addr
	}
	return fmt.Sprintf("%s:%d", addr, port)
}
