package datapath

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/google/gopacket/layers"

	"github.com/onehop/onehop/internal/bpftest"
)

// ctKeyOf is ct_key_of in bpf/lib/conntrack.h: the flow's key, the same
// from both directions, and the direction of (src, sport) -> (dst, dport).
func ctKeyOf(src netip.Addr, sport uint16, dst netip.Addr, dport uint16, proto uint8) (CtKey, uint8) {
	s, d := IPKey(src), IPKey(dst)
	be := func(p uint16) uint16 { return binary.NativeEndian.Uint16(binary.BigEndian.AppendUint16(nil, p)) }
	sp, dp := be(sport), be(dport)
	if s < d || (s == d && sp <= dp) {
		return CtKey{AddrA: s, AddrB: d, PortA: sp, PortB: dp, Proto: proto}, ctOpenedAB
	}
	return CtKey{AddrA: d, AddrB: s, PortA: dp, PortB: sp, Proto: proto}, ctOpenedBA
}

// CT_OPENED_AB, CT_OPENED_BA and CT_CUT in bpf/lib/conntrack_maps.h.
const (
	ctOpenedAB = 1
	ctOpenedBA = 2
	ctCut      = 4
)

func conntrackEntries(t *testing.T, k *Kernel) map[CtKey]CtEntry {
	t.Helper()
	out := map[CtKey]CtEntry{}
	var key CtKey
	var val CtEntry
	it := k.vif.Conntrack.Iterate()
	for it.Next(&key, &val) {
		out[key] = val
	}
	if err := it.Err(); err != nil {
		t.Fatalf("read conntrack: %v", err)
	}
	return out
}

// One entry per flow: the reply builds the same key as the packet that
// opened the flow, so the one lookup it makes finds it. (Before, a reply
// looked up its own direction first, missed, and looked again the other
// way round.)
func TestPrivilegedAReplyFindsItsFlowsOneEntry(t *testing.T) {
	k := loadTestKernel(t)
	tcp := layers.IPProtocolTCP
	open := frame{Src: vmac(web1), Dst: vmac(gw), Saddr: web1, Daddr: db1, Proto: tcp, Dport: 5432}
	runTable(t, k, k.VifProgram(), []progCase{{name: "web1 opens tcp/5432 to db1",
		in: open, wantVerdict: bpftest.ActRedirect, want: routedOut(open), wantTo: 7, wantForward: "to_fabric,routed"}})
	entries := conntrackEntries(t, k)
	replyKey, replyDir := ctKeyOf(db1, 5432, web1, 40000, 6)
	openKey, openDir := ctKeyOf(web1, 40000, db1, 5432, 6)
	if replyKey != openKey || replyDir == openDir {
		t.Fatalf("both directions must share a key and differ in direction: %+v/%d vs %+v/%d", replyKey, replyDir, openKey, openDir)
	}
	e, ok := entries[replyKey]
	if len(entries) != 1 || !ok {
		t.Fatalf("conntrack holds %d entries %v, want exactly the flow's one, keyed %+v", len(entries), entries, replyKey)
	}
	if e.Opened != openDir {
		t.Fatalf("entry opened %#x, want %#x (the way web1 opened it)", e.Opened, openDir)
	}
	// The reply's one lookup is that key: it passes, and adds nothing.
	reply := frame{Src: h2MAC, Dst: h1MAC, Saddr: db1, Daddr: web1, Proto: tcp, Sport: 5432, Dport: 40000}
	runTable(t, k, k.UplinkProgram(), []progCase{{name: "db1's reply passes on the flow's entry",
		in: reply, wantVerdict: bpftest.ActRedirect, want: delivered(reply), wantTo: 1, wantPeer: true, wantForward: "from_fabric"}})
	after := conntrackEntries(t, k)
	if len(after) != 1 || after[replyKey].Opened != openDir {
		t.Fatalf("after the reply conntrack holds %v, want the one entry, still opened %#x", after, openDir)
	}
}

// Rules are one-way: the flow's entry lets web1's flow's replies back, and
// nothing db1 opens itself.
func TestPrivilegedAOneWayRuleStillRefusesNewFlowsTheOtherWay(t *testing.T) {
	k := loadTestKernel(t)
	tcp, udp := layers.IPProtocolTCP, layers.IPProtocolUDP
	open := frame{Src: vmac(web1), Dst: vmac(gw), Saddr: web1, Daddr: db1, Proto: tcp, Dport: 5432}
	runTable(t, k, k.VifProgram(), []progCase{{name: "web1 opens tcp/5432 to db1 (web -> db tcp/5432)",
		in: open, wantVerdict: bpftest.ActRedirect, want: routedOut(open), wantTo: 7, wantForward: "to_fabric,routed"}})
	reply := frame{Src: h2MAC, Dst: h1MAC, Saddr: db1, Daddr: web1, Proto: tcp, Sport: 5432, Dport: 40000}
	runTable(t, k, k.UplinkProgram(), []progCase{
		{name: "db1 opening tcp/5432 towards web1 is refused",
			in:          frame{Src: h2MAC, Dst: h1MAC, Saddr: db1, Daddr: web1, Proto: tcp, Sport: 40000, Dport: 5432},
			wantVerdict: bpftest.ActShot, wantDrop: "not_visible"},
		{name: "db1 opening from port 5432 to another port of web1 is refused",
			in:          frame{Src: h2MAC, Dst: h1MAC, Saddr: db1, Daddr: web1, Proto: tcp, Sport: 5432, Dport: 40001},
			wantVerdict: bpftest.ActShot, wantDrop: "not_visible"},
		{name: "udp on the flow's ports is another flow, and refused",
			in:          frame{Src: h2MAC, Dst: h1MAC, Saddr: db1, Daddr: web1, Proto: udp, Sport: 5432, Dport: 40000},
			wantVerdict: bpftest.ActShot, wantDrop: "not_visible"},
		{name: "the flow's reply passes",
			in: reply, wantVerdict: bpftest.ActRedirect, want: delivered(reply), wantTo: 1, wantPeer: true, wantForward: "from_fabric"},
	})
	if n := len(conntrackEntries(t, k)); n != 1 {
		t.Fatalf("refused packets left entries: %d in conntrack, want 1", n)
	}
}

// A reply of a flow the rules no longer allow the way it was opened is
// refused: the flow is cut, both ways.
func TestPrivilegedAWithdrawnFlowsRepliesAreRefused(t *testing.T) {
	k := loadTestKernel(t)
	tcp := layers.IPProtocolTCP
	open := frame{Src: vmac(web1), Dst: vmac(gw), Saddr: web1, Daddr: db1, Proto: tcp, Dport: 5432}
	runTable(t, k, k.VifProgram(), []progCase{{name: "web1 opens tcp/5432 to db1",
		in: open, wantVerdict: bpftest.ActRedirect, want: routedOut(open), wantTo: 7, wantForward: "to_fabric,routed"}})
	d := testDesired()
	d.Visibility = d.Visibility[1:] // web -> db withdrawn
	applyDesired(t, k, d)
	reply := frame{Src: h2MAC, Dst: h1MAC, Saddr: db1, Daddr: web1, Proto: tcp, Sport: 5432, Dport: 40000}
	runTable(t, k, k.UplinkProgram(), []progCase{
		{name: "db1's reply no longer passes: the flow is cut, counted once as revoked",
			in: reply, wantVerdict: bpftest.ActShot, wantDrop: "revoked"},
		{name: "its next reply is refused for the reason the flow was cut",
			in: reply, wantVerdict: bpftest.ActShot, wantDrop: "not_visible"},
	})
	entries := conntrackEntries(t, k)
	key, _ := ctKeyOf(web1, 40000, db1, 5432, 6)
	if e, ok := entries[key]; len(entries) != 1 || !ok || e.Opened&ctCut == 0 {
		t.Fatalf("conntrack holds %v, want only the withdrawn flow, marked cut", entries)
	}
}

// A ping each way with the same id is one entry opened both ways, and each
// side's echo replies pass.
func TestPrivilegedPingsBothWaysShareOneEntry(t *testing.T) {
	d := testDesired()
	d.Visibility = append(d.Visibility, intentVis(1, 1, 1, 2, 1, 0)) // web -> db icmp too
	k := loadTestKernelWith(t, d)
	icmp := layers.IPProtocolICMPv4
	ping := frame{Src: vmac(web1), Dst: vmac(gw), Saddr: web1, Daddr: db1, Proto: icmp, ICMPID: 9}
	runTable(t, k, k.VifProgram(), []progCase{{name: "web1 pings db1 with id 9",
		in: ping, wantVerdict: bpftest.ActRedirect, want: routedOut(ping), wantTo: 7, wantForward: "to_fabric,routed"}})
	theirs := frame{Src: h2MAC, Dst: h1MAC, Saddr: db1, Daddr: web1, Proto: icmp, ICMPID: 9, TTL: 63}
	theirReply := frame{Src: h2MAC, Dst: h1MAC, Saddr: db1, Daddr: web1, Proto: icmp, ICMPType: 100, ICMPID: 9, TTL: 63}
	runTable(t, k, k.UplinkProgram(), []progCase{
		{name: "db1 pings web1 with the same id",
			in: theirs, wantVerdict: bpftest.ActRedirect, want: delivered(theirs), wantTo: 1, wantPeer: true, wantForward: "from_fabric"},
		{name: "db1's echo reply to web1's ping passes",
			in: theirReply, wantVerdict: bpftest.ActRedirect, want: delivered(theirReply), wantTo: 1, wantPeer: true, wantForward: "from_fabric"},
	})
	mine := frame{Src: vmac(web1), Dst: vmac(gw), Saddr: web1, Daddr: db1, Proto: icmp, ICMPType: 100, ICMPID: 9}
	runTable(t, k, k.VifProgram(), []progCase{{name: "web1's echo reply to db1's ping passes",
		in: mine, wantVerdict: bpftest.ActRedirect, want: routedOut(mine), wantTo: 7, wantForward: "to_fabric,routed"}})
	key, _ := ctKeyOf(web1, 9, db1, 9, 1)
	entries := conntrackEntries(t, k)
	if len(entries) != 1 || entries[key].Opened != ctOpenedAB|ctOpenedBA {
		t.Fatalf("conntrack %v, want one entry opened both ways", entries)
	}
}
