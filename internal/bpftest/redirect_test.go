package bpftest_test

import (
	"encoding/binary"
	"slices"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/bpftest"
	"github.com/onehop/onehop/internal/datapath"
	"github.com/onehop/onehop/internal/testenv"
)

// The log is decoded by the layout the object's BTF gives: here held to
// struct redirect_trace as bpf/lib/redirect.h writes it (count, then
// ifindex[8], then kind[8], native-endian __u32s).
func TestPrivilegedRedirectLogReadsStructRedirectTrace(t *testing.T) {
	testenv.RequireRoot(t, "BPF_PROG_RUN (unprivileged BPF is disabled on this machine)")
	k, err := datapath.OpenTestObjects()
	if err != nil {
		t.Fatalf("%+v", err)
	}
	t.Cleanup(func() { k.Close() })
	prog := k.VifProgram()
	log := bpftest.OpenRedirectLog(t, prog)
	m := bpftest.ProgramMap(t, prog, "redirect_log")
	trace := func(count uint32, entries ...bpftest.Redirect) []byte {
		b := make([]byte, 4+8*4+8*4)
		binary.NativeEndian.PutUint32(b, count)
		for i, e := range entries {
			binary.NativeEndian.PutUint32(b[4+4*i:], e.Ifindex)
			binary.NativeEndian.PutUint32(b[4+32+4*i:], uint32(e.Kind))
		}
		return b
	}
	want := []bpftest.Redirect{{Ifindex: 42, Kind: bpftest.RedirectClone}, {Ifindex: 7, Kind: bpftest.RedirectOut},
		{Ifindex: 1, Kind: bpftest.RedirectPeer}, {Ifindex: 9, Kind: bpftest.RedirectIn}, {Ifindex: 5, Kind: bpftest.RedirectCloneIn}}
	if err := m.Put(uint32(0), trace(uint32(len(want)), want...)); err != nil {
		t.Fatal(err)
	}
	if got := log.Read(t); !slices.Equal(got, want) {
		t.Fatalf("read %+v, want %+v", got, want)
	}
	log.Reset(t)
	if got := log.Read(t); len(got) != 0 {
		t.Fatalf("after a reset: %+v", got)
	}
	for _, c := range []struct {
		name  string
		value []byte
		fail  string
	}{
		{"entries lost past the end", trace(9), "9 redirects in one run: more than the log holds (8)"},
		{"a kind the C does not have", trace(1, bpftest.Redirect{Ifindex: 3, Kind: 7}), "redirect log entry 0 of unknown kind 7"},
	} {
		if err := m.Put(uint32(0), c.value); err != nil {
			t.Fatal(err)
		}
		got := failures(t, func(tb testing.TB) { log.Read(tb) })
		if len(got) != 1 || !strings.Contains(got[0], c.fail) {
			t.Errorf("%s: failed with %q, want %q", c.name, got, c.fail)
		}
	}
}
