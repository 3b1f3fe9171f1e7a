package datapath

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/cilium/ebpf"
)

// stalePin is a pinned map the programs being loaded cannot reuse (another
// size, from a --*-size flag changed across a restart; or another layout
// from another build), moved aside so a new map takes its name.
type stalePin struct {
	name, aside string
	old         *ebpf.Map
}

// setAsideStalePins moves aside every pinned map under dir that spec's map
// of the same name cannot reuse, and leaves the others, which the load
// reuses as they are. The running programs keep the old maps until their
// links are switched to the new programs.
func setAsideStalePins(spec *ebpf.CollectionSpec, dir string) ([]stalePin, error) {
	var stale []stalePin
	for name, ms := range spec.Maps {
		if ms.Pinning != ebpf.PinByName {
			continue
		}
		path := filepath.Join(dir, name)
		m, err := ebpf.LoadPinnedMap(path, nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			restorePins(stale)
			return nil, fmt.Errorf("pinned map %s: %w", name, err)
		}
		cerr := ms.Compatible(m)
		if cerr == nil {
			m.Close()
			continue
		}
		if !errors.Is(cerr, ebpf.ErrMapIncompatible) {
			m.Close()
			restorePins(stale)
			return nil, fmt.Errorf("pinned map %s: %w", name, cerr)
		}
		aside := path + asideSuffix
		os.Remove(aside) // left by an agent killed mid-replacement
		if err := os.Rename(path, aside); err != nil {
			m.Close()
			restorePins(stale)
			return nil, fmt.Errorf("set aside pinned map %s: %w", name, err)
		}
		slog.Info("pinned map does not match what is being loaded; its entries move to a new map", "map", name, "why", cerr)
		stale = append(stale, stalePin{name: name, aside: aside, old: m})
	}
	return stale, nil
}

// restorePins puts the set-aside pins back (a load that failed).
func restorePins(stale []stalePin) {
	for _, s := range stale {
		os.Rename(s.aside, strings.TrimSuffix(s.aside, asideSuffix))
		s.old.Close()
	}
}

// moveEntries copies each set-aside map's entries into the new map of its
// name, as many as it takes (an LRU takes all, forgetting the least
// recently used if smaller), then drops the old pin. A map whose key or
// value changed cannot be copied: it starts empty, and is named in the log.
func moveEntries(stale []stalePin, maps map[string]*ebpf.Map) {
	for _, s := range stale {
		copied, err := copyMap(s.old, maps[s.name])
		if err != nil {
			slog.Warn("pinned map replaced without its entries", "map", s.name, "copied", copied, "err", err)
		} else {
			slog.Info("pinned map replaced, entries kept", "map", s.name, "entries", copied)
		}
		s.old.Close()
		os.Remove(s.aside)
	}
}

// copyMap copies every entry of from into to, which must have the same
// type, key and value sizes.
func copyMap(from, to *ebpf.Map) (int, error) {
	if to == nil {
		return 0, errors.New("no new map of that name")
	}
	if from.Type() != to.Type() || from.KeySize() != to.KeySize() || from.ValueSize() != to.ValueSize() {
		return 0, fmt.Errorf("layout changed: %s key %d value %d, now %s key %d value %d",
			from.Type(), from.KeySize(), from.ValueSize(), to.Type(), to.KeySize(), to.ValueSize())
	}
	switch from.Type() {
	case ebpf.Hash, ebpf.LRUHash, ebpf.Array:
	default:
		return 0, fmt.Errorf("entries of a %s are not copied", from.Type())
	}
	key, val := make([]byte, from.KeySize()), make([]byte, from.ValueSize())
	n := 0
	it := from.Iterate()
	for it.Next(&key, &val) {
		if err := to.Put(key, val); err != nil {
			return n, fmt.Errorf("after %d entries: %w", n, err)
		}
		n++
	}
	return n, it.Err()
}

// asideSuffix marks a set-aside pin: bpffs refuses names with a dot, and no
// C identifier has a dash.
const asideSuffix = "-old"
