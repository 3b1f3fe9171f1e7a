package tap

import (
	"encoding/binary"
	"fmt"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"

	"github.com/onehop/onehop/internal/datapath"
)

// TAP's records are generated from bpf/tap_types.c, but written into the
// router's maps: each must be, byte for byte, what the router's map holds.
func TestTheRecordsAreTheRoutersMaps(t *testing.T) {
	own, err := loadTap()
	if err != nil {
		t.Fatal(err)
	}
	router, err := datapath.MapSpecs()
	if err != nil {
		t.Fatal(err)
	}
	if len(own.Maps) == 0 {
		t.Fatal("bpf/tap_types.c defines no map")
	}
	for name, m := range own.Maps {
		if m.Pinning == ebpf.PinNone {
			continue // its own (.bss): never loaded, never the router's
		}
		r, ok := router[name]
		if !ok {
			t.Errorf("map %s: the router's programs have none", name)
			continue
		}
		if m.Type != r.Type || m.KeySize != r.KeySize || m.ValueSize != r.ValueSize || m.MaxEntries != r.MaxEntries || m.Flags != r.Flags {
			t.Errorf("map %s: %s key %d value %d entries %d flags %d here, the router's %s key %d value %d entries %d flags %d",
				name, m.Type, m.KeySize, m.ValueSize, m.MaxEntries, m.Flags, r.Type, r.KeySize, r.ValueSize, r.MaxEntries, r.Flags)
		}
		for _, side := range []struct {
			what      string
			mine, its btf.Type
		}{{"key", m.Key, r.Key}, {"value", m.Value, r.Value}} {
			if got, want := btfLayout(side.mine), btfLayout(side.its); got != want {
				t.Errorf("map %s: %s is %s here, %s in the router", name, side.what, got, want)
			}
		}
	}
	for _, c := range []struct {
		record any
		m      string
		key    bool
	}{
		{keyRecord{}, MapIndex, true},
		{bitsRecord{}, MapIndex, false},
		{ruleRecord{}, MapRules, false},
		{targetRecord{}, MapTargets, false},
		{limitsRecord{}, MapConfig, false},
		{countersRecord{}, MapStats, false},
	} {
		want := router[c.m].ValueSize
		if c.key {
			want = router[c.m].KeySize
		}
		if got := binary.Size(c.record); got != int(want) {
			t.Errorf("%T is %d bytes, the router's %s holds %d", c.record, got, c.m, want)
		}
	}
}

// btfLayout describes a BTF type by what decides its bytes: names, sizes and
// offsets, members and all.
func btfLayout(typ btf.Type) string {
	typ = btf.UnderlyingType(typ)
	size, _ := btf.Sizeof(typ)
	switch v := typ.(type) {
	case *btf.Struct:
		parts := make([]string, 0, len(v.Members))
		for _, m := range v.Members {
			parts = append(parts, fmt.Sprintf("%s@%d:%s", m.Name, m.Offset, btfLayout(m.Type)))
		}
		return fmt.Sprintf("struct %s(%d){%s}", v.Name, size, strings.Join(parts, " "))
	case *btf.Array:
		return fmt.Sprintf("[%d]%s", v.Nelems, btfLayout(v.Type))
	default:
		return fmt.Sprintf("%s(%d)", typ.TypeName(), size)
	}
}
