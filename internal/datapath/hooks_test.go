package datapath

import (
	"slices"
	"testing"

	"github.com/cilium/ebpf"
)

// RedirectTrace is what one test run of a program redirected and cloned
// (struct redirect_trace, bpf/lib/redirect.h; only in the test objects).
type RedirectTrace = vifTestRedirectTrace

const (
	redirectOut   = uint32(vifTestRedirectKindREDIRECT_OUT)
	redirectPeer  = uint32(vifTestRedirectKindREDIRECT_PEER)
	redirectClone = uint32(vifTestRedirectKindREDIRECT_CLONE)
)

// redirectLog finds the redirect_log map of prog (a test object): the
// program's own, found through the maps the kernel says it uses, so the
// loader needs no test-only field.
func redirectLog(t testing.TB, prog *ebpf.Program) *ebpf.Map {
	t.Helper()
	info, err := prog.Info()
	if err != nil {
		t.Fatalf("program info: %v", err)
	}
	ids, ok := info.MapIDs()
	if !ok {
		t.Fatal("the kernel does not list a program's maps")
	}
	for _, id := range ids {
		m, err := ebpf.NewMapFromID(id)
		if err != nil {
			t.Fatalf("map %d: %v", id, err)
		}
		mi, err := m.Info()
		if err == nil && mi.Name == "redirect_log" {
			t.Cleanup(func() { m.Close() })
			return m
		}
		m.Close()
	}
	t.Fatal("the program has no redirect_log: not built with ONEHOP_TEST_HOOKS")
	return nil
}

// checkRedirects compares where the run sent the frame and its copies with
// what the row says.
func checkRedirects(t *testing.T, trace *ebpf.Map, c progCase) {
	t.Helper()
	var tr RedirectTrace
	if err := trace.Lookup(uint32(0), &tr); err != nil {
		t.Fatalf("read redirect log: %v", err)
	}
	if int(tr.Count) > len(tr.Kind) {
		t.Fatalf("%d redirects in one run: more than the log holds", tr.Count)
	}
	var clones, redirects []uint32
	var peer []bool
	for i := 0; i < int(tr.Count); i++ {
		switch tr.Kind[i] {
		case redirectClone:
			clones = append(clones, tr.Ifindex[i])
		case redirectOut, redirectPeer:
			redirects = append(redirects, tr.Ifindex[i])
			peer = append(peer, tr.Kind[i] == redirectPeer)
		default:
			t.Fatalf("redirect log entry %d of unknown kind %d", i, tr.Kind[i])
		}
	}
	if !slices.Equal(clones, c.wantClones) {
		t.Errorf("copies sent to ifindexes %v, want %v", clones, c.wantClones)
	}
	if c.wantVerdict != actRedirect {
		if len(redirects) != 0 {
			t.Errorf("verdict %d, but the run redirected to %v", c.wantVerdict, redirects)
		}
		return
	}
	if c.wantTo == 0 {
		t.Fatal("a redirect row must say where the frame goes (wantTo)")
	}
	if len(redirects) != 1 {
		t.Fatalf("%d redirects (%v) in one run, want 1", len(redirects), redirects)
	}
	if redirects[0] != c.wantTo || peer[0] != c.wantPeer {
		t.Errorf("redirected to ifindex %d (into its peer: %v), want %d (into its peer: %v)",
			redirects[0], peer[0], c.wantTo, c.wantPeer)
	}
}
