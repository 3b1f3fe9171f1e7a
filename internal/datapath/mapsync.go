package datapath

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// The helpers a feature's Sync uses to make a reconciled map hold exactly a
// plan, writing only what changed: it keeps what it last wrote (cur) and
// reads the map once, when it starts (ReadMap).

// ReadMap reads the map's non-zero entries into into: an array's zeroed
// slots are empty.
func ReadMap[K, V comparable](k *Kernel, name string, into map[K]V) error {
	m, err := k.Map(name)
	if err != nil {
		return err
	}
	var key K
	var val, zero V
	it := m.Iterate()
	for it.Next(&key, &val) {
		if val != zero {
			into[key] = val
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("read %s: %w", name, err)
	}
	return nil
}

// Table is what PutChanged and RemoveGone write to: an *ebpf.Map, or a
// test's wrapper that counts or fails the writes.
type Table interface {
	Put(key, value any) error
	Delete(key any) error
}

// PutChanged writes every entry of want that cur does not hold as it is,
// and records it in cur.
func PutChanged[K, V comparable](m Table, cur, want map[K]V, what string) error {
	for k, v := range want {
		if c, ok := cur[k]; ok && c == v {
			continue
		}
		if err := m.Put(k, v); err != nil {
			return fmt.Errorf("write %s: %w", what, err)
		}
		cur[k] = v
	}
	return nil
}

// RemoveGone takes out every entry of cur that want does not have: deleted
// from a hash, zeroed in an array.
func RemoveGone[K, V comparable](m Table, cur, want map[K]V, array bool, what string) error {
	for k := range cur {
		if _, ok := want[k]; ok {
			continue
		}
		var err error
		if array {
			var zero V
			err = m.Put(k, zero)
		} else if err = m.Delete(k); errors.Is(err, ebpf.ErrKeyNotExist) {
			err = nil
		}
		if err != nil {
			return fmt.Errorf("remove from %s: %w", what, err)
		}
		delete(cur, k)
	}
	return nil
}
