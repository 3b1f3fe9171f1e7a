package datapath

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
)

// Sizes are the tables an operator sizes when the agent loads the datapath
// (its --*-size flags); 0 keeps the compiled-in default. docs/sizing.md
// lists what one entry of each costs.
type Sizes struct {
	Mappings  int // mapping table: remote VMs this host can address at once (LRU)
	Conntrack int // flows tracked at once (LRU)
	// Visibility is how many visibility rules one rule set holds; the
	// map holds two sets, so a changed set is written beside the old.
	Visibility int
	Hosts      int // other hosts' uplinks heard on the fabric
	FragFlows  int // fragmented datagrams whose later fragments are admitted (LRU)
}

// SizeSpec describes one sized table.
type SizeSpec struct {
	Flag     string // the agent's flag
	Map      string // the map's name in the C
	Default  int    // the C's max_entries (per rule set for visibility)
	Min, Max int
	What     string
	get      func(*Sizes) *int
	// perSet: the map holds two of what the flag counts (rule sets).
	perSet bool
}

// SizeSpecs lists every table the agent sizes. The bounds: below Min a
// table stops doing its job (an LRU with too few entries per CPU, a host
// that cannot hear a small fabric); above Max it takes more memory than
// any host should spend on it (docs/sizing.md: each entry's cost).
var SizeSpecs = []SizeSpec{
	{Flag: "--mapping-table-size", Map: "mappings", Default: 16384, Min: MinMappingTableSize, Max: 1 << 24,
		What: "remote VMs this host can address at once (LRU beyond it)", get: func(s *Sizes) *int { return &s.Mappings }},
	{Flag: "--conntrack-size", Map: "conntrack", Default: 65536, Min: 1024, Max: 1 << 24,
		What: "flows tracked at once (LRU beyond it)", get: func(s *Sizes) *int { return &s.Conntrack }},
	{Flag: "--visibility-size", Map: "visibility", Default: 16384, Min: 64, Max: 1 << 20, perSet: true,
		What: "visibility rules of one rule set (the map holds two)", get: func(s *Sizes) *int { return &s.Visibility }},
	{Flag: "--hosts-size", Map: "hosts", Default: 4096, Min: 16, Max: 1 << 20,
		What: "other hosts heard on the fabric", get: func(s *Sizes) *int { return &s.Hosts }},
	{Flag: "--frag-size", Map: "frag_flows", Default: 16384, Min: 256, Max: 1 << 22,
		What: "fragmented datagrams tracked (LRU beyond it)", get: func(s *Sizes) *int { return &s.FragFlows }},
}

// Get returns the size sp names in s, 0 for the default.
func (sp SizeSpec) Get(s *Sizes) int { return *sp.get(s) }

// Field is the field of s that sp names, for a flag to set.
func (sp SizeSpec) Field(s *Sizes) *int { return sp.get(s) }

// Validate reports every size out of its bounds, naming its flag.
func (s Sizes) Validate() error {
	var errs []error
	for _, sp := range SizeSpecs {
		n := sp.Get(&s)
		if n == 0 {
			continue
		}
		if n < sp.Min || n > sp.Max {
			errs = append(errs, fmt.Errorf("%s %d: must be between %d and %d (%s)", sp.Flag, n, sp.Min, sp.Max, sp.What))
		}
	}
	return errors.Join(errs...)
}

// apply sizes spec's maps; maps of the sizes left at 0 keep the C's.
func (s Sizes) apply(spec *ebpf.CollectionSpec) error {
	if err := s.Validate(); err != nil {
		return err
	}
	for _, sp := range SizeSpecs {
		n := sp.Get(&s)
		if n == 0 {
			continue
		}
		ms, ok := spec.Maps[sp.Map]
		if !ok {
			return fmt.Errorf("%s: the programs have no map %s", sp.Flag, sp.Map)
		}
		if sp.perSet {
			n *= 2
		}
		ms.MaxEntries = uint32(n)
	}
	return nil
}

// MapMemory is the memory the kernel charges for the map named name (what
// /proc/self/fdinfo of the map reports as memlock), in bytes.
func (k *Kernel) MapMemory(name string) (int64, error) {
	m, ok := k.maps[name]
	if !ok {
		return 0, fmt.Errorf("no map %s", name)
	}
	return mapMemlock(m)
}

// mapMemlock reads the memlock line of m's fdinfo: the kernel's own figure
// for the map's memory (bpf_map_memory_usage), preallocated entries
// included.
func mapMemlock(m *ebpf.Map) (int64, error) {
	path := fmt.Sprintf("/proc/self/fdinfo/%d", m.FD())
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("map memory: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "memlock:"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("map memory: %s: memlock %q: %w", path, v, err)
			}
			return n, nil
		}
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("map memory: %s: %w", path, err)
	}
	return 0, fmt.Errorf("map memory: %s has no memlock line", path)
}
