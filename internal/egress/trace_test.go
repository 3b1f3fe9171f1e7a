package egress

import (
	"testing"

	"github.com/google/gopacket/layers"

	"github.com/onehop/onehop/internal/bpftest"
	"github.com/onehop/onehop/internal/trace"
)

// onehop trace from an external to a host's address (a reply to a VM's
// egress flow) runs the uplink's egress steering in the trace instance: it
// names the VM the reply goes into, or the host's stack for a port of a
// slice no flow of that sender holds, and touches no translation (a real
// reply moves its flow's deadline and flags, and counts for the VM).
func TestPrivilegedTraceOfAReplyToAVMsEgressFlowNamesItsVMAndChangesNothing(t *testing.T) {
	h := loadEgressHost(t, egressDesired())
	tcp := layers.IPProtocolTCP
	out := bpftest.Run(t, h.k.VifProgram(), fromVM(vmA, bpftest.Frame{Daddr: inet, Proto: tcp, Sport: 40000, Dport: 80}).Bytes(t))
	port := l4Word(out.Out, 0)
	if port < sliceALo || port > sliceALo+3 {
		t.Fatalf("a's flow left from port %d, want one of its slice %d-%d", port, sliceALo, sliceALo+3)
	}
	rows := []struct {
		name string
		in   bpftest.Frame
		want trace.Run
	}{
		{"the reply: back into a", bpftest.Frame{Src: inetMAC, Dst: h1MAC, Saddr: inet, Daddr: hostAddr, Proto: tcp, Sport: 80, Dport: port},
			trace.Run{Program: "uplink", Verdict: "redirect", Forwards: []string{"egress_in"}, To: 1, ToKind: "peer"}},
		{"to b's slice, where no flow of inet's is", bpftest.Frame{Src: inetMAC, Dst: h1MAC, Saddr: inet, Daddr: hostAddr, Proto: tcp, Sport: 80, Dport: sliceBLo},
			trace.Run{Program: "uplink", Verdict: "pass", Forwards: []string{"host_stack"}}},
	}
	before := bpftest.MapSnapshot(t, h.k.Maps())
	for round := 0; round < 20; round++ {
		for _, r := range rows {
			got, err := h.k.Trace(trace.AgentRequest{Program: trace.ProgramUplink, Frame: r.in.Bytes(t)})
			if err != nil {
				t.Fatalf("%s: %v", r.name, err)
			}
			got.Out, got.ToName = nil, ""
			if round == 0 && got.String() != r.want.String() {
				t.Errorf("%s:\n got %s\nwant %s", r.name, got, r.want)
			}
		}
	}
	bpftest.SameSnapshots(t, before, bpftest.MapSnapshot(t, h.k.Maps()), "20 rounds of traces")

	for _, r := range rows {
		c0, _ := h.k.Counters()
		bpftest.Run(t, h.k.UplinkProgram(), r.in.Bytes(t))
		c1, _ := h.k.Counters()
		var drops []string
		if r.want.Drop != "" {
			drops = []string{r.want.Drop}
		}
		bpftest.MovedOnce(t, r.name+": the real packet", "drop", c0.Drops, c1.Drops, drops...)
		bpftest.MovedOnce(t, r.name+": the real packet", "forward", c0.Forwards, c1.Forwards, r.want.Forwards...)
	}
	after := bpftest.MapSnapshot(t, h.k.Maps())
	for _, name := range []string{"egress_state", "egress_stats"} {
		if after[name] == before[name] {
			t.Errorf("the real reply left %s as it was: the snapshots compared nothing live there", name)
		}
	}
}
