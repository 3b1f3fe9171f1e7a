package datapath

import (
	"net/netip"
	"os"
	"testing"

	"github.com/onehop/onehop/internal/intent"
)

// applyDesired compiles d as the agent would and applies it to k.
func applyDesired(t testing.TB, k *Kernel, d intent.Desired) {
	t.Helper()
	if err := k.Apply(compileTest(t, d, testIfindex), ""); err != nil {
		t.Fatalf("apply: %v", err)
	}
}

func intentVis(srcFarm, srcSubnet, dstFarm, dstSubnet uint16, proto uint8, port uint16) intent.VisRule {
	return intent.VisRule{SrcFarm: srcFarm, SrcSubnet: srcSubnet, DstFarm: dstFarm, DstSubnet: dstSubnet, Proto: proto, Port: port}
}

// routedOut is what h1 sends to h2 for a frame a local VM routed to a VM on
// h2: host MACs, one hop less.
func routedOut(f frame) *frame {
	f.Src, f.Dst, f.TTL = h1MAC, h2MAC, orDefault(f.TTL, 64)-1
	return &f
}

// delivered is what a local VM receives of a frame from h2: its own MAC as
// destination, from the sender's (same subnet) or its gateway's MAC.
func delivered(f frame) *frame {
	f.Dst = vmac(f.Daddr)
	f.Src = vmac(f.Saddr)
	if !sameSubnet(f.Saddr, f.Daddr) {
		f.Src = vmac(netip.AddrFrom4([4]byte{f.Daddr.As4()[0], f.Daddr.As4()[1], f.Daddr.As4()[2], 1}))
	}
	return &f
}

func sameSubnet(a, b netip.Addr) bool {
	x, y := a.As4(), b.As4()
	return x[0] == y[0] && x[1] == y[1] && x[2] == y[2]
}

// web3OnLoopback gives web3's vif the ifindex BPF_PROG_RUN injects frames
// on (1), so the frames a test sends there come from web3, and web1 another.
func web3OnLoopback(name string) (int, error) {
	switch name {
	case "vif-web3":
		return 1, nil
	case "vif-web1":
		return 42, nil
	}
	return 0, os.ErrNotExist
}
