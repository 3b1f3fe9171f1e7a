package datapath

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/google/gopacket/layers"

	"github.com/onehop/onehop/internal/bpftest"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/trace"
)

// traceDesired is h1's desired state with a firewall on web1 that refuses
// ssh out (rule id 7), so every decision a trace names has a row.
func traceDesired() intent.Desired {
	d := testDesired()
	d.Local[0].Firewall = &intent.Firewall{DefaultIn: "allow", DefaultOut: "allow", Rules: []intent.FirewallRule{
		{ID: 7, Dir: "out", Proto: "tcp", PortLo: 22, PortHi: 22, Action: "deny"},
	}}
	return d
}

// A trace runs the real programs on the live maps and says what a real
// packet would meet: the drop reason a real one counts, the rule that
// decided, conntrack, the target; and no map changes however many traces
// run, nothing reaches the ring buffers. The same frame through the live
// program then bumps exactly the counter the trace named.
func TestPrivilegedTraceNamesTheDecisionAndChangesNothing(t *testing.T) {
	k := loadTestKernelWith(t, traceDesired())
	tcp, udp := layers.IPProtocolTCP, layers.IPProtocolUDP
	unmapped := netip.MustParseAddr("10.1.1.9")
	rows := []struct {
		name    string
		program string
		in      frame
		want    trace.Run // Out is not compared
	}{
		{"allowed across subnets by the rule's port key, to h2", trace.ProgramVif,
			frame{Src: vmac(web1), Dst: vmac(gw), Saddr: web1, Daddr: db1, Proto: tcp, Dport: 5432},
			trace.Run{Program: "vif", Verdict: "redirect", Forwards: []string{"to_fabric", "routed"}, To: 7, ToKind: "out",
				Visibility: &trace.VisHit{VisRule: intent.VisRule{SrcFarm: 1, SrcSubnet: 1, DstFarm: 1, DstSubnet: 2, Proto: 6, Port: 5432}, Match: "port", Gen: 1},
				Firewall:   []trace.FwHit{{Dir: "out", How: "default", Allow: true}}, Conntrack: "new"}},
		{"not visible without a rule", trace.ProgramVif,
			frame{Src: vmac(web1), Dst: vmac(gw), Saddr: web1, Daddr: db1, Proto: tcp, Dport: 80},
			trace.Run{Program: "vif", Verdict: "drop", Drop: "not_visible",
				Visibility: &trace.VisHit{VisRule: intent.VisRule{SrcFarm: 1, SrcSubnet: 1, DstFarm: 1, DstSubnet: 2}, Gen: 1}, Conntrack: "new"}},
		{"refused by web1's firewall rule 0 out", trace.ProgramVif,
			frame{Src: vmac(web1), Dst: vmac(web3), Saddr: web1, Daddr: web3, Proto: tcp, Dport: 22},
			trace.Run{Program: "vif", Verdict: "drop", Drop: "firewall_out",
				Firewall: []trace.FwHit{{Dir: "out", How: "rule", Index: 0}}, Conntrack: "new"}},
		{"spoofed source address", trace.ProgramVif,
			frame{Src: vmac(web1), Dst: vmac(web2), Saddr: web3, Daddr: web2, Proto: udp},
			trace.Run{Program: "vif", Verdict: "drop", Drop: "spoofed_ip"}},
		{"spoofed source MAC", trace.ProgramVif,
			frame{Src: vmac(web3), Dst: vmac(web2), Saddr: web1, Daddr: web2, Proto: udp},
			trace.Run{Program: "vif", Verdict: "drop", Drop: "spoofed_mac"}},
		{"same host: into web3's namespace", trace.ProgramVif,
			frame{Src: vmac(web1), Dst: vmac(web3), Saddr: web1, Daddr: web3, Proto: udp, Dport: 53},
			trace.Run{Program: "vif", Verdict: "redirect", Forwards: []string{"local"}, To: 42, ToKind: "peer",
				Firewall: []trace.FwHit{{Dir: "out", How: "default", Allow: true}}, Conntrack: "new"}},
		{"unmapped destination: held and asked for", trace.ProgramVif,
			frame{Src: vmac(web1), Dst: vmac(unmapped), Saddr: web1, Daddr: unmapped, Proto: udp, Dport: 53},
			trace.Run{Program: "vif", Verdict: "to agent", Forwards: []string{"held"}, Slow: "hold", Ask: true,
				Firewall: []trace.FwHit{{Dir: "out", How: "default", Allow: true}}, Conntrack: "new"}},
		{"arriving from h2: into web1", trace.ProgramUplink,
			frame{Src: h2MAC, Dst: h1MAC, Saddr: web2, Daddr: web1, Proto: tcp, Dport: 80},
			trace.Run{Program: "uplink", Verdict: "redirect", Forwards: []string{"from_fabric"}, To: 1, ToKind: "peer",
				Firewall: []trace.FwHit{{Dir: "in", How: "default", Allow: true}}, Conntrack: "new"}},
		{"arriving from a host that does not hold the source", trace.ProgramUplink,
			frame{Src: h3MAC, Dst: h1MAC, Saddr: web2, Daddr: web1, Proto: tcp, Dport: 80},
			trace.Run{Program: "uplink", Verdict: "drop", Drop: "fabric_unknown_src"}},
	}
	before := bpftest.MapSnapshot(t, k.maps)
	for round := 0; round < 50; round++ {
		for _, r := range rows {
			got, err := k.Trace(trace.AgentRequest{Program: r.program, Src: web1.String(), Frame: r.in.bytes(t)})
			if err != nil {
				t.Fatalf("%s: %v", r.name, err)
			}
			got.Out, got.ToName = nil, ""
			if round == 0 && got.String() != r.want.String() {
				t.Errorf("%s:\n got %s\nwant %s", r.name, got, r.want)
			}
		}
	}
	after := bpftest.MapSnapshot(t, k.maps)
	bpftest.SameSnapshots(t, before, after, "50 rounds of traces")
	bpftest.RingEmpty(t, k.vif.DropEvents, "drop events")
	bpftest.RingEmpty(t, k.vif.Slowpath, "slow path")

	// The allowed trace's output is what h2 gets: host MAC to host MAC.
	run, err := k.Trace(trace.AgentRequest{Program: trace.ProgramVif, Src: web1.String(), Frame: rows[0].in.bytes(t)})
	if err != nil {
		t.Fatal(err)
	}
	if want := (frame{Src: h1MAC, Dst: h2MAC, Saddr: web1, Daddr: db1, Proto: tcp, Dport: 5432, TTL: 63}).bytes(t); !bytes.HasPrefix(run.Out, want) {
		t.Errorf("allowed trace left the frame as %x, want %x", run.Out, want)
	}

	// Now the real packets: each drop the trace named is the counter the
	// live program bumps on the same frame (so the snapshot above was of
	// live, moving counters).
	for _, r := range rows {
		if r.want.Drop == "" {
			continue
		}
		prog := k.VifProgram()
		if r.program == trace.ProgramUplink {
			prog = k.UplinkProgram()
		}
		c0, _ := k.Counters()
		bpftest.Run(t, prog, r.in.bytes(t))
		c1, _ := k.Counters()
		bpftest.MovedOnce(t, r.name+": the real packet", "drop", c0.Drops, c1.Drops, r.want.Drop)
	}
	if now := bpftest.MapSnapshot(t, k.maps); now["drops"] == before["drops"] {
		t.Error("the real packets moved no drop counter: the snapshots compared nothing live")
	}
}
