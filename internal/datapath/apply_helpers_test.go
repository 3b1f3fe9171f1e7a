package datapath

import (
	"testing"

	"github.com/onehop/onehop/internal/intent"
)

// applyDesired compiles d as the agent would and applies it to k.
func applyDesired(t testing.TB, k *Kernel, d intent.Desired) {
	t.Helper()
	e, missing, err := Compile(d, h1Uplink, testIfindex)
	if err != nil || len(missing) != 0 {
		t.Fatalf("compile: %v (missing %v)", err, missing)
	}
	e.Attach = nil
	if err := k.Apply(e, ""); err != nil {
		t.Fatalf("apply: %v", err)
	}
}

func intentVis(srcFarm, srcSubnet, dstFarm, dstSubnet, proto uint8, port uint16) intent.VisRule {
	return intent.VisRule{SrcFarm: srcFarm, SrcSubnet: srcSubnet, DstFarm: dstFarm, DstSubnet: dstSubnet, Proto: proto, Port: port}
}
