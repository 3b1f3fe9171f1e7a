package bpftest

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
)

// Verdicts a tc program returns (linux/pkt_cls.h).
const (
	ActOK       = 0 // TC_ACT_OK: on to the stack
	ActShot     = 2 // TC_ACT_SHOT: dropped
	ActStolen   = 4 // TC_ACT_STOLEN: consumed (its clones went on)
	ActRedirect = 7 // TC_ACT_REDIRECT: whatever the target; the redirect log says which
)

// RedirectKind is how a frame left a program: enum redirect_kind
// (bpf/lib/redirect.h). The kernel keeps no BTF of the enum with a loaded
// object, so internal/datapath's tests hold these values to the Go
// constants bpf2go generates from it.
type RedirectKind uint32

// The kinds of enum redirect_kind.
const (
	RedirectNone  RedirectKind = 0
	RedirectOut   RedirectKind = 1 // bpf_redirect to a device's egress
	RedirectPeer  RedirectKind = 2 // bpf_redirect_peer: into a veth peer's namespace
	RedirectClone RedirectKind = 3 // bpf_clone_redirect: a copy out of a device
	RedirectIn    RedirectKind = 4 // bpf_redirect to a device's ingress
	// RedirectCloneIn is bpf_clone_redirect to a device's ingress: a copy
	// into a macvtap guest.
	RedirectCloneIn RedirectKind = 5
	// RedirectNeigh is bpf_redirect_neigh out of a device: the host's
	// routes and neighbours pick the next hop (egress).
	RedirectNeigh RedirectKind = 6
)

var kindNames = [...]string{"REDIRECT_NONE", "REDIRECT_OUT", "REDIRECT_PEER", "REDIRECT_CLONE", "REDIRECT_IN", "REDIRECT_CLONE_IN", "REDIRECT_NEIGH"}

// String is the kind's name in the C.
func (k RedirectKind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("redirect kind %d", uint32(k))
}

// Redirect is one entry of the redirect log: a frame or a copy sent to
// Ifindex.
type Redirect struct {
	Ifindex uint32
	Kind    RedirectKind
}

// RedirectLog is the redirect_log map of one test object: what one run
// redirected and cloned, in order (struct redirect_trace). Its layout is
// read from the object's BTF, so it is written down once, in C.
type RedirectLog struct {
	m                    *ebpf.Map
	size                 uint32
	count, ifindex, kind uint32 // byte offsets of the members
	max                  int    // entries the log holds (REDIRECT_LOG_MAX)
}

// OpenRedirectLog finds the redirect_log map of prog among the maps the
// kernel says it uses, so loaders need no test-only field. It fails t when
// prog is not built with ONEHOP_TEST_HOOKS.
func OpenRedirectLog(t testing.TB, prog *ebpf.Program) *RedirectLog {
	t.Helper()
	m, mi := findMap(t, prog, "redirect_log")
	if m == nil {
		t.Fatal("the program has no redirect_log: not built with ONEHOP_TEST_HOOKS")
	}
	l, err := newRedirectLog(m, mi)
	if err != nil {
		t.Fatalf("redirect_log: %v", err)
	}
	return l
}

// ProgramMap is prog's map called name (as the C names it), found among
// the maps the kernel says prog uses; it fails t when there is none.
func ProgramMap(t testing.TB, prog *ebpf.Program, name string) *ebpf.Map {
	t.Helper()
	m, _ := findMap(t, prog, name)
	if m == nil {
		t.Fatalf("the program uses no map %s", name)
	}
	return m
}

// findMap is prog's map called name (nil: none), closed when t ends.
func findMap(t testing.TB, prog *ebpf.Program, name string) (*ebpf.Map, *ebpf.MapInfo) {
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
		if err == nil && mi.Name == name {
			t.Cleanup(func() { m.Close() })
			return m, mi
		}
		m.Close()
	}
	return nil, nil
}

func newRedirectLog(m *ebpf.Map, mi *ebpf.MapInfo) (*RedirectLog, error) {
	id, ok := mi.BTFID()
	if !ok {
		return nil, fmt.Errorf("no BTF")
	}
	h, err := btf.NewHandleFromID(id)
	if err != nil {
		return nil, fmt.Errorf("BTF %d: %w", id, err)
	}
	defer h.Close()
	spec, err := h.Spec(nil)
	if err != nil {
		return nil, fmt.Errorf("BTF %d: %w", id, err)
	}
	var st *btf.Struct
	if err := spec.TypeByName("redirect_trace", &st); err != nil {
		return nil, fmt.Errorf("BTF %d: %w", id, err)
	}
	l := &RedirectLog{m: m, size: mi.ValueSize}
	found := 0
	for _, mb := range st.Members {
		off := uint32(mb.Offset.Bytes())
		switch mb.Name {
		case "count":
			if sz, err := btf.Sizeof(mb.Type); err != nil || sz != 4 {
				return nil, fmt.Errorf("member count of %d bytes, not 4 (%v)", sz, err)
			}
			l.count = off
			found++
		case "ifindex", "kind":
			a, ok := mb.Type.(*btf.Array)
			if !ok {
				return nil, fmt.Errorf("member %s is %s, not an array", mb.Name, mb.Type)
			}
			if sz, err := btf.Sizeof(a.Type); err != nil || sz != 4 {
				return nil, fmt.Errorf("member %s: entries of %d bytes, not 4 (%v)", mb.Name, sz, err)
			}
			if l.max != 0 && l.max != int(a.Nelems) {
				return nil, fmt.Errorf("ifindex and kind hold different numbers of entries")
			}
			l.max = int(a.Nelems)
			if mb.Name == "ifindex" {
				l.ifindex = off
			} else {
				l.kind = off
			}
			found++
		}
	}
	if found != 3 || st.Size != mi.ValueSize {
		return nil, fmt.Errorf("struct redirect_trace (%d bytes) is not {count, ifindex[], kind[]} of the map's %d bytes", st.Size, mi.ValueSize)
	}
	return l, nil
}

// Reset empties the log: before each run.
func (l *RedirectLog) Reset(t testing.TB) {
	t.Helper()
	if err := l.m.Put(uint32(0), make([]byte, l.size)); err != nil {
		t.Fatalf("reset redirect log: %v", err)
	}
}

// Read is what the runs since the last Reset redirected and cloned, in
// order. It fails t when the log overflowed (entries were lost) or names a
// kind the C does not have.
func (l *RedirectLog) Read(t testing.TB) []Redirect {
	t.Helper()
	b := make([]byte, l.size)
	if err := l.m.Lookup(uint32(0), &b); err != nil {
		t.Fatalf("read redirect log: %v", err)
	}
	n := int(binary.NativeEndian.Uint32(b[l.count:]))
	if n > l.max {
		t.Fatalf("%d redirects in one run: more than the log holds (%d)", n, l.max)
	}
	out := make([]Redirect, n)
	for i := range out {
		out[i] = Redirect{
			Ifindex: binary.NativeEndian.Uint32(b[l.ifindex+uint32(4*i):]),
			Kind:    RedirectKind(binary.NativeEndian.Uint32(b[l.kind+uint32(4*i):])),
		}
		if out[i].Kind == RedirectNone || out[i].Kind > RedirectNeigh {
			t.Fatalf("redirect log entry %d of unknown kind %d", i, out[i].Kind)
		}
	}
	return out
}
