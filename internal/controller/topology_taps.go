package controller

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/tappolicy"
	"github.com/onehop/onehop/internal/topology"
)

// TapSeed is a TAP policy a topology file names, as written, and the line
// of each of its keys' values, for errors.
type TapSeed struct {
	tappolicy.Spec
	Line  int
	Lines map[string]int
}

func topologyTaps(t *topology.File) []TapSeed {
	var out []TapSeed
	for _, tp := range t.Taps() {
		out = append(out, TapSeed{Spec: tp.Spec, Line: tp.Line, Lines: tp.Lines})
	}
	return out
}

// line is where the value of key is, or the tap's own line.
func (s TapSeed) line(key string) int {
	if l := s.Lines[key]; l > 0 {
		return l
	}
	return s.Line
}

// fileFabric is the fabric a topology file gives its hosts, as the node
// records their agents will report: each uplink's address on the file's
// fabric prefix. A file seeds a store no agent has reported to yet, so a
// collector it names is checked against these.
func fileFabric(t *topology.File) []intent.Node {
	// A File built in code (the scale harness) may name no fabric: its
	// uplink addresses then stand alone, and no collector is on them.
	bits := 32
	if p, err := netip.ParsePrefix(t.Fabric.CIDR); err == nil {
		bits = p.Bits()
	}
	nodes := make([]intent.Node, 0, len(t.Hosts))
	for _, h := range t.Hosts {
		n := intent.Node{Name: h.Name}
		addrs := h.UplinkAddrs
		if len(addrs) == 0 {
			addrs = []string{h.Address}
		}
		for k, a := range addrs {
			n.Uplinks = append(n.Uplinks, intent.NodeUplink{Index: k, Name: topology.UplinkName(k), IP: a, Bits: bits})
		}
		nodes = append(nodes, n)
	}
	return nodes
}

// applyTaps makes the store's TAP policies those of a topology file: each
// is created (or replaced, keeping its ID) through the checks the API
// applies, against the VMs the file has just written (so a VM named by
// its IP or MAC resolves here) and a collector against the file's fabric
// (fileFabric); policies the file does not name are removed. An error
// names the file line of the field at fault.
func (c *Controller) applyTaps(ctx context.Context, path string, seeds []TapSeed, fabric []intent.Node) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	have, _, err := store.ListJSON[intent.TapPolicy](ctx, c.store, intent.TapsPrefix)
	if err != nil {
		return err
	}
	keep := map[string]bool{}
	for _, s := range seeds {
		keep[s.Name] = true
	}
	for _, p := range have {
		if !keep[p.Name] {
			if err := c.store.Delete(ctx, tapKey(p.Name)); err != nil {
				return err
			}
		}
	}
	for _, s := range seeds {
		p, err := tappolicy.ParseSpec(s.Spec)
		if err == nil {
			exists := slices.ContainsFunc(have, func(h intent.TapPolicy) bool { return h.Name == s.Name })
			_, err = c.writeTap(ctx, p, !exists, fabric)
		}
		var fe *tappolicy.FieldError
		var cfe *FieldError
		switch {
		case err == nil:
		case errors.As(err, &fe):
			return fmt.Errorf("%s:%d: tap %s: %s: %s", path, s.line(fe.Field), s.Name, fe.Field, fe.Msg)
		case errors.As(err, &cfe):
			return fmt.Errorf("%s:%d: tap %s: %s: %s", path, s.line(fileKey(cfe.Field)), s.Name, fileKey(cfe.Field), cfe.Msg)
		default:
			return fmt.Errorf("%s:%d: tap %s: %w", path, s.Line, s.Name, err)
		}
	}
	return nil
}

// fileKey is the topology key of an API field (sportLo is sport).
func fileKey(field string) string {
	switch field {
	case "sportLo", "sportHi":
		return "sport"
	case "dportLo", "dportHi":
		return "dport"
	case "bothDirections":
		return "both_directions"
	case "crossFarm":
		return "cross_farm"
	}
	return field
}
