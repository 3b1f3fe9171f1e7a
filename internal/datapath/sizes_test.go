package datapath

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
)

func TestSizesOutOfBoundsAreRefusedNamingTheFlag(t *testing.T) {
	for _, tc := range []struct {
		s    Sizes
		want []string
	}{
		{Sizes{Conntrack: 10}, []string{"--conntrack-size 10", "between 1024"}},
		{Sizes{Mappings: 1 << 25, Hosts: 1}, []string{"--mapping-table-size 33554432", "--hosts-size 1"}},
		{Sizes{Visibility: 1 << 21}, []string{"--visibility-size 2097152"}},
		{Sizes{FragFlows: 1}, []string{"--frag-size 1"}},
	} {
		err := tc.s.Validate()
		if err == nil {
			t.Errorf("%+v accepted", tc.s)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%+v: error %q does not say %q", tc.s, err, w)
			}
		}
	}
	if err := (Sizes{}).Validate(); err != nil {
		t.Errorf("defaults refused: %v", err)
	}
	if err := (Sizes{Mappings: 1_000_000, Conntrack: 1 << 20, Visibility: 64, Hosts: 16, FragFlows: 256}).Validate(); err != nil {
		t.Errorf("sizes in bounds refused: %v", err)
	}
}

// Every sized map must exist in the programs with the spec's default, so a
// flag's default and the C never drift apart.
func TestSizeSpecDefaultsAreTheCompiledSizes(t *testing.T) {
	spec, err := loadVif()
	if err != nil {
		t.Fatal(err)
	}
	for _, sp := range SizeSpecs {
		ms, ok := spec.Maps[sp.Map]
		if !ok {
			t.Errorf("%s: no map %s in the vif program", sp.Flag, sp.Map)
			continue
		}
		want := uint32(sp.Default)
		if sp.perSet {
			want *= 2
		}
		if ms.MaxEntries != want {
			t.Errorf("%s: default %d, but map %s has max_entries %d", sp.Flag, sp.Default, sp.Map, ms.MaxEntries)
		}
	}
}

// The kernel's own figure (memlock in the map's fdinfo) for each sized map
// at its default and at a larger size: the difference over the added
// entries is the memory one entry costs, which docs/sizing.md lists.
func TestPrivilegedSizedMapsMemoryPerEntry(t *testing.T) {
	small := openTestKernel(t, Options{})
	var big Sizes
	for _, sp := range SizeSpecs {
		*sp.Field(&big) = min(sp.Max, 4*sp.Default)
	}
	large := openTestKernel(t, Options{Sizes: big})
	for _, sp := range SizeSpecs {
		m1, err := small.MapMemory(sp.Map)
		if err != nil {
			t.Fatal(err)
		}
		m2, err := large.MapMemory(sp.Map)
		if err != nil {
			t.Fatal(err)
		}
		n1, n2 := int64(small.maps[sp.Map].MaxEntries()), int64(large.maps[sp.Map].MaxEntries())
		if n2 != 4*n1 {
			t.Errorf("%s %d: map %s has %d entries, want %d", sp.Flag, sp.Get(&big), sp.Map, n2, 4*n1)
			continue
		}
		per := float64(m2-m1) / float64(n2-n1)
		if per <= 0 {
			t.Errorf("%s: memory did not grow with the map (%d -> %d bytes)", sp.Flag, m1, m2)
		}
		t.Logf("%-22s %-10s %8d entries: %9d bytes; %8d: %10d bytes; %.1f bytes per map entry", sp.Flag, sp.Map, n1, m1, n2, m2, per)
	}
	// visibility is not preallocated (BPF_F_NO_PREALLOC): above, only its
	// buckets; each rule written costs its element besides.
	const rules = 10000
	before, err := large.MapMemory("visibility")
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < rules; i++ {
		key := VisKey{SrcFarm: uint16(i >> 8), SrcSubnet: uint16(i & 0xff), DstFarm: 1, DstSubnet: 2, Proto: 6, Port: 80}
		if err := large.maps["visibility"].Put(key, uint8(1)); err != nil {
			t.Fatalf("write rule %d: %v", i, err)
		}
	}
	after, err := large.MapMemory("visibility")
	if err != nil {
		t.Fatal(err)
	}
	if after <= before {
		t.Errorf("visibility: %d rules written, memory %d -> %d bytes", rules, before, after)
	}
	t.Logf("visibility: %d rules written: %d -> %d bytes, %.1f bytes per rule beyond the buckets", rules, before, after,
		float64(after-before)/rules)
}

// Issue 12: the mapping table at a million entries fits in 100 MiB, by the
// kernel's own count, and holds them.
func TestPrivilegedMappingTableOfAMillionEntriesFitsIn100MiB(t *testing.T) {
	const n = 1_000_000
	k := openTestKernel(t, Options{Sizes: Sizes{Mappings: n}})
	if got := k.MappingCapacity(); got != n {
		t.Fatalf("mapping table holds %d, want %d", got, n)
	}
	mem, err := k.MapMemory("mappings")
	if err != nil {
		t.Fatal(err)
	}
	if mem > 100<<20 {
		t.Errorf("mapping table of %d entries takes %d bytes (%.1f MiB); want at most 100 MiB", n, mem, float64(mem)/(1<<20))
	}
	// Fill it, in batches as the kernel takes them: a preallocated LRU
	// must not need more than it charged at creation.
	const fill = n * 9 / 10
	keys := make([]uint32, 0, 65536)
	vals := make([]Mapping, 0, 65536)
	for i := 0; i < fill; i++ {
		keys = append(keys, IPKey(vmAddr(i)))
		vals = append(vals, Mapping{HostMac: [6]byte{2, 0, 0, 0, byte(i >> 8), byte(i)}, ConfirmedNs: 1, UsedNs: 1})
		if len(keys) == cap(keys) || i == fill-1 {
			if _, err := k.vif.Mappings.BatchUpdate(keys, vals, &ebpf.BatchOptions{}); err != nil {
				t.Fatalf("fill the mapping table at %d: %v", i, err)
			}
			keys, vals = keys[:0], vals[:0]
		}
	}
	held := 0
	var key uint32
	var val Mapping
	for it := k.vif.Mappings.Iterate(); it.Next(&key, &val); {
		held++
	}
	after, err := k.MapMemory("mappings")
	if err != nil {
		t.Fatal(err)
	}
	if after != mem {
		t.Errorf("the table's memory moved from %d to %d bytes when filled", mem, after)
	}
	if held < fill*99/100 {
		t.Errorf("table of %d holds %d of %d entries written", n, held, fill)
	}
	t.Logf("mapping table of %d entries: %d bytes (%.1f MiB, %.1f bytes per entry) by the kernel's count; holds %d of %d written",
		n, mem, float64(mem)/(1<<20), float64(mem)/n, held, fill)
}

// vmAddr is the i-th address of 10.0.0.0/8 past 10.0.0.0.
func vmAddr(i int) netip.Addr {
	n := uint32(10<<24) + uint32(i) + 1
	return netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)})
}

// The ARP engine reads the whole mapping table every second: every entry
// must come back, and at 200,000 entries the read must not take the agent's
// second (the time is reported, beside one entry at a time).
func TestPrivilegedMappingsReadsEveryEntryOfALargeTable(t *testing.T) {
	const n = 200_000
	k := openTestKernel(t, Options{Sizes: Sizes{Mappings: 262144}})
	keys := make([]uint32, 0, n)
	vals := make([]Mapping, 0, n)
	for i := 0; i < n; i++ {
		keys = append(keys, IPKey(vmAddr(i)))
		vals = append(vals, Mapping{HostMac: [6]byte{2, 0, 0, 0, byte(i >> 8), byte(i)}, ConfirmedNs: uint64(i), UsedNs: 1})
	}
	if _, err := k.vif.Mappings.BatchUpdate(keys, vals, &ebpf.BatchOptions{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	got, err := k.Mappings()
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[netip.Addr]bool{}
	for _, e := range got {
		if seen[e.IP] {
			t.Fatalf("%s read twice", e.IP)
		}
		seen[e.IP] = true
		i := int(e.Confirmed)
		if e.IP != vmAddr(i) || e.HostMAC[5] != byte(i) {
			t.Fatalf("entry %+v read wrong", e)
		}
	}
	if len(got) != n {
		t.Errorf("read %d entries of %d", len(got), n)
	}
	start = time.Now()
	one := 0
	var key uint32
	var val Mapping
	for it := k.vif.Mappings.Iterate(); it.Next(&key, &val); {
		one++
	}
	t.Logf("%d mappings read in %v in batches; %v one entry at a time", n, took.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
}
