// Package trace is `onehop trace` without a kernel: what a trace asks for,
// the frame it crafts, what one program run on one host found (Run, the
// datapath's record, bpf/lib/trace.h) and how those runs read as steps
// naming the rules an operator knows by id (Explain). The agents run the
// programs (internal/datapath.Kernel.Trace); the controller crafts the
// frame, asks the hosts involved and explains (docs/troubleshooting.md).
package trace

import (
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/onehop/onehop/internal/intent"
)

// Request is what the operator asks: what would happen to a packet from
// From to To. From and To are a VM (farm/subnet/vm), an address, a sliver
// (host/sliver) or an external (its address).
type Request struct {
	From  string `json:"from"`
	To    string `json:"to"`
	Proto string `json:"proto,omitempty"` // tcp (default), udp, icmp
	Sport uint16 `json:"sport,omitempty"`
	Dport uint16 `json:"dport,omitempty"`
	Flags string `json:"flags,omitempty"` // TCP flags: letters of FSRPAU (default S)
	// SrcIP is the source address the packet claims, when not FROM's
	// own: what anti-spoofing does with a forged one.
	SrcIP string `json:"srcIP,omitempty"`
}

// Invalid is a request's error: Field names the parameter at fault (the
// API's query parameter, the CLI's flag or argument).
type Invalid struct {
	Field string
	Msg   string
}

func (e *Invalid) Error() string { return e.Msg }

func invalid(field, format string, a ...any) error {
	return &Invalid{Field: field, Msg: fmt.Sprintf(format, a...)}
}

// Normalize fills the defaults and checks what can be checked without the
// intent; errors are *Invalid, naming the field.
func (r Request) Normalize() (Request, error) {
	if r.From == "" {
		return r, invalid("from", "from: empty; want a VM (farm/subnet/vm), a sliver (host/sliver) or an address")
	}
	if r.To == "" {
		return r, invalid("to", "to: empty; want a VM (farm/subnet/vm), a sliver (host/sliver) or an address")
	}
	if r.SrcIP != "" {
		a, err := netip.ParseAddr(r.SrcIP)
		if err != nil || !a.Is4() {
			return r, invalid("src-ip", "src-ip %q: want an IPv4 address", r.SrcIP)
		}
	}
	r.Proto = strings.ToLower(r.Proto)
	switch r.Proto {
	case "":
		r.Proto = "tcp"
	case "tcp", "udp", "icmp":
	default:
		return r, invalid("proto", "proto %q: want tcp, udp or icmp", r.Proto)
	}
	if r.Proto == "icmp" {
		if r.Sport != 0 || r.Dport != 0 {
			field := "dport"
			if r.Sport != 0 {
				field = "sport"
			}
			return r, invalid(field, "%s: an ICMP echo has no ports (its echo id is fixed)", field)
		}
		if r.Flags != "" {
			return r, invalid("flags", "flags %q: TCP flags on an ICMP echo", r.Flags)
		}
		return r, nil
	}
	if r.Sport == 0 {
		r.Sport = 40000
	}
	if r.Dport == 0 {
		return r, invalid("dport", "dport: required for %s (the port rules and firewalls match on)", r.Proto)
	}
	if r.Proto == "udp" && r.Flags != "" {
		return r, invalid("flags", "flags %q: TCP flags on a UDP datagram", r.Flags)
	}
	if r.Proto == "tcp" {
		if r.Flags == "" {
			r.Flags = "S"
		}
		r.Flags = strings.ToUpper(r.Flags)
		for _, c := range r.Flags {
			if !strings.ContainsRune("FSRPAU", c) {
				return r, invalid("flags", "flags %q: %q is no TCP flag; want letters of FSRPAU (S: SYN, A: ACK, ...)", r.Flags, c)
			}
		}
	}
	return r, nil
}

// EchoID is the echo id of every traced ICMP echo.
const EchoID = 0x7472 // "tr"

// Frame crafts the IPv4 packet of r from src to dst in an Ethernet frame
// from srcMAC to dstMAC, every checksum right: what the sending VM would
// put on its vif.
func Frame(r Request, src, dst netip.Addr, srcMAC, dstMAC net.HardwareAddr) ([]byte, error) {
	if !src.Is4() || !dst.Is4() {
		return nil, fmt.Errorf("trace %s -> %s: IPv4 only", src, dst)
	}
	eth := &layers.Ethernet{SrcMAC: srcMAC, DstMAC: dstMAC, EthernetType: layers.EthernetTypeIPv4}
	ip := &layers.IPv4{Version: 4, IHL: 5, TTL: 64, Id: 1, SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
	payload := gopacket.Payload([]byte("onehop trace"))
	var l4 gopacket.SerializableLayer
	switch r.Proto {
	case "udp":
		ip.Protocol = layers.IPProtocolUDP
		u := &layers.UDP{SrcPort: layers.UDPPort(r.Sport), DstPort: layers.UDPPort(r.Dport)}
		u.SetNetworkLayerForChecksum(ip)
		l4 = u
	case "icmp":
		ip.Protocol = layers.IPProtocolICMPv4
		l4 = &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(layers.ICMPv4TypeEchoRequest, 0), Id: EchoID, Seq: 1}
	default:
		ip.Protocol = layers.IPProtocolTCP
		t := &layers.TCP{SrcPort: layers.TCPPort(r.Sport), DstPort: layers.TCPPort(r.Dport), Seq: 1, Window: 1000}
		for _, c := range r.Flags {
			switch c {
			case 'F':
				t.FIN = true
			case 'S':
				t.SYN = true
			case 'R':
				t.RST = true
			case 'P':
				t.PSH = true
			case 'A':
				t.ACK = true
			case 'U':
				t.URG = true
			}
		}
		t.SetNetworkLayerForChecksum(ip)
		l4 = t
	}
	buf := gopacket.NewSerializeBuffer()
	opts := gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}
	if err := gopacket.SerializeLayers(buf, opts, eth, ip, l4, payload); err != nil {
		return nil, fmt.Errorf("craft frame %s -> %s: %w", src, dst, err)
	}
	return buf.Bytes(), nil
}

// Programs a host runs a trace with.
const (
	ProgramVif    = "vif"    // the sending VM's vif program, on its host
	ProgramUplink = "uplink" // the uplink program of the receiving host
	ProgramSliver = "sliver" // port space's program on the sending sliver's link, on its host
)

// AgentRequest is what the controller asks one host's agent to run.
type AgentRequest struct {
	ID      string `json:"id"`
	Program string `json:"program"`
	// Src is the sending VM (ProgramVif): the agent runs the program as
	// if the frame came in on its vif.
	Src string `json:"src,omitempty"`
	// Sliver is the sending sliver's slot on its host (ProgramSliver):
	// the agent runs the program as if the frame came in on its link on
	// uplink Uplink.
	Sliver uint32 `json:"sliver,omitempty"`
	// Uplink is the index of the host's uplink (0 the first) the frame
	// comes in by (ProgramUplink) or the sliver sends on (ProgramSliver).
	Uplink int    `json:"uplink,omitempty"`
	Frame  []byte `json:"frame"`
}

// AgentReply is a host's answer to the AgentRequest with the same ID.
type AgentReply struct {
	ID    string `json:"id"`
	Node  string `json:"node"`
	Run   *Run   `json:"run,omitempty"`
	Error string `json:"error,omitempty"`
}

// Run is what one program run found, as the datapath recorded it (struct
// trace_record), with its names resolved by the agent.
type Run struct {
	Program string `json:"program"`
	// Verdict is the tc verdict: "drop", "redirect" or "pass".
	Verdict string `json:"verdict"`
	// Drop is the drop reason counter a real packet would have bumped
	// (the metric's label), "" when it was not dropped.
	Drop string `json:"drop,omitempty"`
	// Forwards are the forward counters it would have bumped.
	Forwards []string `json:"forwards,omitempty"`
	// To is where the frame would have gone: the interface (ifindex and
	// name on that host) and how (out, peer, in).
	To     int    `json:"toIfindex,omitempty"`
	ToName string `json:"toName,omitempty"`
	ToKind string `json:"toKind,omitempty"`
	// Slow is what the agent would have been handed ("hold", "dhcp", ...).
	Slow string `json:"slow,omitempty"`
	// Ask: the mapping table does not know the destination; a real packet
	// would have the agent ask the fabric (the trace asked nothing).
	Ask bool `json:"ask,omitempty"`
	// Visibility is the key that decided between subnets, when one was
	// looked up.
	Visibility *VisHit `json:"visibility,omitempty"`
	// Firewall is how each firewall consulted decided (out: the sender's,
	// in: the receiver's).
	Firewall []FwHit `json:"firewall,omitempty"`
	// Conntrack is what the host's conntrack said: "new", "established",
	// "reply", "rechecked", or "" when it was not consulted.
	Conntrack string `json:"conntrack,omitempty"`
	// Out is the frame as the program left it (what the next host gets).
	Out []byte `json:"out,omitempty"`
}

// VisHit is a visibility key the datapath looked up (a compiled rule's
// shape), and whether it matched (Match: "port", "proto", "any"; "" when
// no key did).
type VisHit struct {
	intent.VisRule
	Match string `json:"match,omitempty"`
	Gen   uint8  `json:"gen"`
}

// FwHit is how one VM's firewall decided: by its Index-th rule of
// direction Dir ("in" or "out") or by its default ("default"), or a
// missing rule ("missing").
type FwHit struct {
	Dir   string `json:"dir"`
	How   string `json:"how"`
	Index int    `json:"index"`
	Allow bool   `json:"allow"`
}

// String is the run in one line, for logs.
func (r Run) String() string {
	b, _ := json.Marshal(r)
	return string(b)
}
