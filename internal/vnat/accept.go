package vnat

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// Accept writes only the ingress half of each migration: packets arriving
// at the new physical tuple are given to the connection's socket, while
// what the socket sends still leaves untranslated. A moving end calls it
// before it tells the peer where it is (VNAT_UPD): the peer translates as
// soon as it accepts the update and may send at once (a keepalive, data),
// and a segment reaching the new address with no socket for its tuple is
// answered with a RESET. The egress half waits for the peer's answer, for
// the same reason the other way round: a segment from the new address
// reaching the peer before its translation would be reset there.
// Translate/TranslateBatch later take the entry over; Unaccept withdraws
// it. All or nothing.
func (d *Kernel) Accept(ms []Migration) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.accepting == nil {
		d.accepting = map[Virtual]XlateKey{}
	}
	keys := make([]XlateKey, 0, len(ms))
	vals := make([]Rewrite, 0, len(ms))
	for _, m := range ms {
		if v, ok := d.table.byPhysical[m.Physical]; ok && v != m.Virtual {
			return fmt.Errorf("vnat: accept %s at %s: another connection (%s) travels as it", m.Virtual, m.Physical, v)
		}
		e, err := Entries(m.Virtual, m.Physical)
		if err != nil {
			return fmt.Errorf("vnat: accept: %w", err)
		}
		keys = append(keys, e[1].Key)
		vals = append(vals, e[1].Value)
	}
	if len(keys) == 0 {
		return nil
	}
	if _, err := d.objs.VnatXlate.BatchUpdate(keys, vals, nil); err != nil {
		var errs []error
		for _, k := range keys {
			if err := d.objs.VnatXlate.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				errs = append(errs, err)
			}
		}
		return fmt.Errorf("vnat: accept %d connections: %w", len(ms), errors.Join(append([]error{err}, errs...)...))
	}
	for i, m := range ms {
		d.accepting[m.Virtual] = keys[i]
	}
	return d.syncActive()
}

// Unaccept withdraws what Accept wrote for these connections (the peer
// refused them): an entry a translation took over meanwhile stays.
func (d *Kernel) Unaccept(vs []Virtual) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	var errs []error
	for _, v := range vs {
		errs = append(errs, d.settle(v))
	}
	return errors.Join(append(errs, d.syncActive())...)
}

// settle ends v's accepted ingress entry: deleted unless v's translation
// now owns that key. Called with d.mu held.
func (d *Kernel) settle(v Virtual) error {
	k, ok := d.accepting[v]
	if !ok {
		return nil
	}
	delete(d.accepting, v)
	if p, ok := d.table.Lookup(v); ok {
		if e, err := Entries(v, p); err == nil && e[1].Key == k {
			return nil
		}
	}
	if err := d.objs.VnatXlate.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("vnat: withdraw the accepted entry of %s: %w", v, err)
	}
	return nil
}
