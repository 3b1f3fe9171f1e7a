package portspace

import (
	"testing"

	"github.com/google/gopacket/layers"

	"github.com/onehop/onehop/internal/bpftest"
	"github.com/onehop/onehop/internal/trace"
)

// A trace from a sliver runs port space's own program (a trace_mode
// instance on the live maps) and says what a real frame would meet: the
// drop reason a real one counts, or where it goes (out of the uplink, to
// the sliver or host holding the port on the shared address); from the
// fabric the uplink program steers by port the same way. However many
// traces run, no map changes, though they pass where a real frame takes a
// share, records an echo id or a fragment and counts; the same frames
// through the live programs then move exactly the counters the traces
// named, and those maps.
func TestPrivilegedSliverTraceNamesThePortSpaceDecisionAndChangesNothing(t *testing.T) {
	k, f, _ := loadFeature(t)
	syncPlan(t, f, testPlan(1)) // s1 sends, on ifindex 1
	udp := layers.IPProtocolUDP
	rows := []struct {
		name    string
		program string
		in      bpftest.Frame
		want    trace.Run // Out and ToName are not compared
	}{
		{"s1 to the Internet from its own port: out of the uplink", trace.ProgramSliver,
			bpftest.Frame{Src: upMAC, Dst: peerMAC, Saddr: public, Daddr: inet, Proto: udp, Sport: 10001, Dport: 53},
			trace.Run{Program: "sliver", Verdict: "redirect", Forwards: []string{"from_sliver"}, To: uplinkIf, ToKind: "out"}},
		{"s1's first fragment: recorded by a real frame, not by the trace", trace.ProgramSliver,
			bpftest.Frame{Src: upMAC, Dst: peerMAC, Saddr: public, Daddr: inet, Proto: udp, Sport: 10002, Dport: 53, IPID: 77, MoreFragments: true},
			trace.Run{Program: "sliver", Verdict: "redirect", Forwards: []string{"from_sliver"}, To: uplinkIf, ToKind: "out"}},
		{"s1's echo request with an id of its lease: recorded by a real frame only", trace.ProgramSliver,
			bpftest.Frame{Src: upMAC, Dst: peerMAC, Saddr: public, Daddr: inet, Proto: layers.IPProtocolICMPv4, ICMPType: 8, ICMPID: 10005},
			trace.Run{Program: "sliver", Verdict: "redirect", Forwards: []string{"from_sliver"}, To: uplinkIf, ToKind: "out"}},
		{"s1 from s2's port", trace.ProgramSliver,
			bpftest.Frame{Src: upMAC, Dst: peerMAC, Saddr: public, Daddr: inet, Proto: udp, Sport: 10100, Dport: 53},
			trace.Run{Program: "sliver", Verdict: "drop", Drop: "ps_foreign_port"}},
		{"s1 from another address", trace.ProgramSliver,
			bpftest.Frame{Src: upMAC, Dst: peerMAC, Saddr: other, Daddr: inet, Proto: udp, Sport: 10001, Dport: 53},
			trace.Run{Program: "sliver", Verdict: "drop", Drop: "ps_foreign_ip"}},
		{"s1 from another MAC", trace.ProgramSliver,
			bpftest.Frame{Src: evilMAC, Dst: peerMAC, Saddr: public, Daddr: inet, Proto: udp, Sport: 10001, Dport: 53},
			trace.Run{Program: "sliver", Verdict: "drop", Drop: "ps_foreign_mac"}},
		{"s1 to the shared address, s2's port: into s2", trace.ProgramSliver,
			bpftest.Frame{Src: upMAC, Dst: upMAC, Saddr: public, Daddr: public, Proto: udp, Sport: 10001, Dport: 10150},
			trace.Run{Program: "sliver", Verdict: "redirect", Forwards: []string{"to_sliver"}, To: s2If, ToKind: "peer"}},
		{"from the Internet to s2's port: steered into s2", trace.ProgramUplink,
			bpftest.Frame{Src: peerMAC, Dst: upMAC, Saddr: inet, Daddr: public, Proto: udp, Sport: 53, Dport: 10150},
			trace.Run{Program: "uplink", Verdict: "redirect", Forwards: []string{"to_sliver"}, To: s2If, ToKind: "peer"}},
		{"from the Internet to a port no sliver leases: the host's", trace.ProgramUplink,
			bpftest.Frame{Src: peerMAC, Dst: upMAC, Saddr: inet, Daddr: public, Proto: udp, Sport: 53, Dport: 40000},
			trace.Run{Program: "uplink", Verdict: "pass", Forwards: []string{"host_stack"}}},
	}
	before := bpftest.MapSnapshot(t, k.Maps())
	for round := 0; round < 20; round++ {
		for _, r := range rows {
			got, err := k.Trace(trace.AgentRequest{Program: r.program, Sliver: 1, Frame: r.in.Bytes(t)})
			if err != nil {
				t.Fatalf("%s: %v", r.name, err)
			}
			got.Out, got.ToName = nil, ""
			if round == 0 && got.String() != r.want.String() {
				t.Errorf("%s:\n got %s\nwant %s", r.name, got, r.want)
			}
		}
	}
	bpftest.SameSnapshots(t, before, bpftest.MapSnapshot(t, k.Maps()), "20 rounds of traces")
	m, err := k.Map("drop_events")
	if err != nil {
		t.Fatal(err)
	}
	bpftest.RingEmpty(t, m, "drop events")

	// The real frames: each moves exactly the counters its trace named.
	for _, r := range rows {
		prog := k.SliverProgram()
		if r.program == trace.ProgramUplink {
			prog = k.UplinkProgram()
		}
		c0, _ := k.Counters()
		bpftest.Run(t, prog, r.in.Bytes(t))
		c1, _ := k.Counters()
		var drops []string
		if r.want.Drop != "" {
			drops = []string{r.want.Drop}
		}
		bpftest.MovedOnce(t, r.name+": the real frame", "drop", c0.Drops, c1.Drops, drops...)
		bpftest.MovedOnce(t, r.name+": the real frame", "forward", c0.Forwards, c1.Forwards, r.want.Forwards...)
	}
	after := bpftest.MapSnapshot(t, k.Maps())
	for _, name := range []string{"portspace_stats", "portspace_echo_ids", "portspace_frags", "portspace_shares"} {
		if after[name] == before[name] {
			t.Errorf("the real frames left %s as it was: the snapshots compared nothing live there", name)
		}
	}
}
