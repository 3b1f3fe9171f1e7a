package datapath

import (
	"errors"
	"math/bits"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
	"github.com/google/gopacket/layers"

	"github.com/onehop/onehop/internal/bpftest"
)

// readEvents drains the drop_events ring: every record there now.
func readEvents(t *testing.T, r *ringbuf.Reader) []ObserveEvent {
	t.Helper()
	var out []ObserveEvent
	for {
		r.SetDeadline(time.Now().Add(50 * time.Millisecond))
		rec, err := r.Read()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return out
		}
		if err != nil {
			t.Fatalf("read drop_events: %v", err)
		}
		ev, err := DecodeObserveEvent(rec.RawSample)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, ev)
	}
}

func openEvents(t *testing.T, k *Kernel) *ringbuf.Reader {
	t.Helper()
	r, err := k.DropEvents()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func TestPrivilegedObserveEventsCarryTheDropAndTheAdmittedFlow(t *testing.T) {
	k := loadTestKernel(t)
	r := openEvents(t, k)
	forged := netip.MustParseAddr("10.2.1.9") // another farm's address
	runTable(t, k, k.VifProgram(), []progCase{
		{name: "web1 forges another farm's source", wantVerdict: bpftest.ActShot, wantDrop: "spoofed_ip",
			in: frame{Src: vmac(web1), Dst: vmac(gw), Saddr: forged, Daddr: db1, Proto: layers.IPProtocolUDP, Sport: 1234, Dport: 53}},
		{name: "an admitted new flow while nobody observes", wantVerdict: bpftest.ActRedirect, wantTo: uint32(h1Uplink.Ifindex), wantForward: "routed,to_fabric",
			in:   frame{Src: vmac(web1), Dst: vmac(gw), Saddr: web1, Daddr: db1, Proto: layers.IPProtocolTCP, Sport: 40001, Dport: 5432},
			want: &frame{Src: h1MAC, Dst: h2MAC, Saddr: web1, Daddr: db1, Proto: layers.IPProtocolTCP, Sport: 40001, Dport: 5432, TTL: 63}},
	})
	got := readEvents(t, r)
	if len(got) != 1 {
		t.Fatalf("events while nobody observes: got %d (%+v), want the drop only", len(got), got)
	}
	ev := got[0]
	if ev.Kind != ObserveDrop || k.DropReason(ev.Reason) != "spoofed_ip" || ev.Ifindex != 1 || ev.Farm != 1 ||
		KeyIP(ev.Saddr) != forged || KeyIP(ev.Daddr) != db1 || ev.Proto != 17 ||
		bits.ReverseBytes16(ev.Sport) != 1234 || bits.ReverseBytes16(ev.Dport) != 53 || ev.Ethertype != 0x0800 || [6]byte(ev.Smac) != [6]byte(vmac(web1)) {
		t.Fatalf("drop event %+v: want spoofed_ip on ifindex 1, farm 1 (the vif's VM's, not the forged source's), udp %s:1234 -> %s:53 from %s",
			ev, forged, db1, vmac(web1))
	}

	if err := k.SetObserve(ObserveLimits{Flows: 1}); err != nil {
		t.Fatal(err)
	}
	runTable(t, k, k.VifProgram(), []progCase{
		{name: "an admitted new flow while someone observes", wantVerdict: bpftest.ActRedirect, wantTo: uint32(h1Uplink.Ifindex), wantForward: "routed,to_fabric",
			in:   frame{Src: vmac(web1), Dst: vmac(gw), Saddr: web1, Daddr: db1, Proto: layers.IPProtocolTCP, Sport: 40002, Dport: 5432},
			want: &frame{Src: h1MAC, Dst: h2MAC, Saddr: web1, Daddr: db1, Proto: layers.IPProtocolTCP, Sport: 40002, Dport: 5432, TTL: 63}},
		{name: "its next packet is no new flow", wantVerdict: bpftest.ActRedirect, wantTo: uint32(h1Uplink.Ifindex), wantForward: "routed,to_fabric",
			in:   frame{Src: vmac(web1), Dst: vmac(gw), Saddr: web1, Daddr: db1, Proto: layers.IPProtocolTCP, Sport: 40002, Dport: 5432},
			want: &frame{Src: h1MAC, Dst: h2MAC, Saddr: web1, Daddr: db1, Proto: layers.IPProtocolTCP, Sport: 40002, Dport: 5432, TTL: 63}},
	})
	got = readEvents(t, r)
	if len(got) != 1 {
		t.Fatalf("events for one new flow: got %d (%+v), want 1", len(got), got)
	}
	ev = got[0]
	if ev.Kind != ObserveFlow || ev.Farm != 1 || KeyIP(ev.Saddr) != web1 || KeyIP(ev.Daddr) != db1 || ev.Proto != 6 ||
		bits.ReverseBytes16(ev.Sport) != 40002 || bits.ReverseBytes16(ev.Dport) != 5432 {
		t.Fatalf("flow event %+v: want farm 1, tcp %s:40002 -> %s:5432", ev, web1, db1)
	}
}

// A farm that floods spends its own budget: its events beyond it are
// counted lost, and another farm's event still goes through.
func TestPrivilegedObserveBudgetIsPerFarm(t *testing.T) {
	// No vif on ifindex 1: the frames the test sends there are an unknown
	// vif's, and each event spends its source's farm's budget.
	k := loadTestKernelWithIfindex(t, testDesired(), func(name string) (int, error) {
		switch name {
		case "vif-web1":
			return 41, nil
		case "vif-web3":
			return 42, nil
		}
		return 0, os.ErrNotExist
	})
	r := openEvents(t, k)
	const burst = 8
	// A refill far slower than the test: the budget is the burst.
	if err := k.SetObserve(ObserveLimits{NsPerEvent: 4_000_000_000, Burst: burst}); err != nil {
		t.Fatal(err)
	}
	flood := frame{Src: vmac(web1), Dst: vmac(gw), Saddr: web1, Daddr: db1, Proto: layers.IPProtocolUDP}
	for range 3 * burst {
		if res := bpftest.Run(t, k.VifProgram(), flood.bytes(t)); res.Verdict != bpftest.ActShot {
			t.Fatalf("flood frame: verdict %d, want shot", res.Verdict)
		}
	}
	other := netip.MustParseAddr("10.2.1.2")
	in := frame{Src: vmac(other), Dst: vmac(gw), Saddr: other, Daddr: db1, Proto: layers.IPProtocolUDP}
	if res := bpftest.Run(t, k.VifProgram(), in.bytes(t)); res.Verdict != bpftest.ActShot {
		t.Fatalf("farm 2's frame: verdict %d, want shot", res.Verdict)
	}
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		t.Fatal(err)
	}
	perFarm := map[uint32]int{}
	for _, ev := range readEvents(t, r) {
		if k.DropReason(ev.Reason) != "unknown_vif" {
			t.Fatalf("event %+v: want unknown_vif", ev)
		}
		perFarm[ev.Farm]++
	}
	// Per CPU: a test thread may move, so farm 1 got at most its burst on
	// each CPU it ran on.
	if perFarm[1] < burst || perFarm[1] > burst*cpus || perFarm[2] != 1 {
		t.Fatalf("events per farm %v: want farm 1 bounded to %d per CPU, farm 2's one event", perFarm, burst)
	}
	lost, err := k.ObserveLost()
	if err != nil {
		t.Fatal(err)
	}
	if int(lost[1]) != 3*burst-perFarm[1] || lost[2] != 0 {
		t.Fatalf("lost %v: want farm 1's %d over its budget, none of farm 2's", lost, 3*burst-perFarm[1])
	}
}
