package tap

import "github.com/onehop/onehop/internal/version"

// The objects this package embeds (bpf2go) count in the binary's BPF
// digest (onehop version); test-only objects do not.
func init() {
	version.RegisterBPF("tap", _TapBytes)
}
