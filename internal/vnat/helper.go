package vnat

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// connKey is v as vnat_conns and vnat_away key it: the local end's view,
// which is what egress sees before any translation (the socket's tuple).
func connKey(v Virtual) vnatVnatConnKey {
	return vnatVnatConnKey{
		Laddr: be32(v.Local.Addr()), Raddr: be32(v.Remote.Addr()),
		Lport: be16(v.Local.Port()), Rport: be16(v.Remote.Port()),
		Proto: uint8(v.Proto),
	}
}

// StartKeepalive marks the TCP connection v "peer away" (paper §3.3.1.3,
// the keepalive helper): from now on this end's egress answers v's TCP
// keepalive probes itself, with the ACK the peer would send, so the
// socket does not reset the connection while the peer is suspended
// (bpf/lib/vnat_helper.h). Marking a connection marked already keeps its
// count of answered probes.
func (d *Kernel) StartKeepalive(v Virtual) error {
	if err := validate(Tuple(v)); err != nil {
		return fmt.Errorf("vnat: keepalive helper: %w", err)
	}
	if v.Proto != TCP {
		return fmt.Errorf("vnat: keepalive helper for %s: only TCP has keepalives", v)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.away[v] {
		return nil
	}
	if err := d.objs.VnatAway.Update(connKey(v), vnatVnatHelper{}, ebpf.UpdateNoExist); err != nil && !errors.Is(err, ebpf.ErrKeyExist) {
		return fmt.Errorf("vnat: keepalive helper for %s: %w", v, err)
	}
	d.away[v] = true
	if err := d.syncActive(); err != nil {
		delete(d.away, v)
		d.objs.VnatAway.Delete(connKey(v)) //nolint:errcheck // best effort: the flag word decides
		return err
	}
	return nil
}

// StopKeepalive unmarks v (its peer is back, or gone for good): its
// probes leave as usual again. It returns how many probes the helper
// answered for v.
func (d *Kernel) StopKeepalive(v Virtual) (uint64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var h vnatVnatHelper
	k := connKey(v)
	if err := d.objs.VnatAway.Lookup(k, &h); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return 0, fmt.Errorf("vnat: read keepalive helper of %s: %w", v, err)
	}
	if err := d.objs.VnatAway.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return 0, fmt.Errorf("vnat: stop keepalive helper of %s: %w", v, err)
	}
	delete(d.away, v)
	return h.Answered, d.syncActive()
}

// KeepaliveAnswered is how many probes the helper answered for v since it
// was marked (false when v is not marked).
func (d *Kernel) KeepaliveAnswered(v Virtual) (uint64, bool, error) {
	var h vnatVnatHelper
	if err := d.objs.VnatAway.Lookup(connKey(v), &h); err != nil {
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return 0, false, nil
		}
		return 0, false, fmt.Errorf("vnat: read keepalive helper of %s: %w", v, err)
	}
	return h.Answered, true, nil
}
