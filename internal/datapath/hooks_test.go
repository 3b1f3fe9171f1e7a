package datapath

import (
	"testing"

	"github.com/onehop/onehop/internal/bpftest"
)

// bpftest reads the test objects' redirect logs with its own copy of enum
// redirect_kind (the kernel keeps no BTF of it): held here to the
// constants bpf2go generates from bpf/lib/redirect.h.
func TestRedirectKindsAreTheCEnum(t *testing.T) {
	for _, k := range []struct {
		got  bpftest.RedirectKind
		want vifTestRedirectKind
	}{
		{bpftest.RedirectNone, vifTestRedirectKindREDIRECT_NONE},
		{bpftest.RedirectOut, vifTestRedirectKindREDIRECT_OUT},
		{bpftest.RedirectPeer, vifTestRedirectKindREDIRECT_PEER},
		{bpftest.RedirectClone, vifTestRedirectKindREDIRECT_CLONE},
		{bpftest.RedirectIn, vifTestRedirectKindREDIRECT_IN},
		{bpftest.RedirectCloneIn, vifTestRedirectKindREDIRECT_CLONE_IN},
		{bpftest.RedirectNeigh, vifTestRedirectKindREDIRECT_NEIGH},
	} {
		if uint32(k.got) != uint32(k.want) {
			t.Errorf("bpftest's %s is %d, the C's is %d", k.got, uint32(k.got), uint32(k.want))
		}
	}
}
