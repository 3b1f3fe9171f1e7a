package controller

import (
	"context"
	"fmt"
	"slices"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/lease"
	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/topology"
)

// SliverSeed is a sliver a topology file names: its lease list as written
// and the line it is on, for errors.
type SliverSeed struct {
	Name, Host, Ports string
	Line              int
}

// topologySlivers reads the slivers of t and how many uplinks each host
// has (topology `slivers:` and `uplinks: N` on a host).
func topologySlivers(t *topology.File) (seeds []SliverSeed, uplinks map[string]int) {
	for _, s := range t.Slivers() {
		seeds = append(seeds, SliverSeed{Name: s.Name, Host: s.Host, Ports: s.Ports, Line: s.Line})
	}
	uplinks = map[string]int{}
	for _, h := range t.Hosts {
		uplinks[h.Name] = max(h.Uplinks, 1)
	}
	return seeds, uplinks
}

// applySlivers makes the store's slivers those of a topology file: each is
// created (or its leases replaced, keeping its slot) through the checks
// the API applies, with the host's uplinks as the file gives them (agents
// have not reported yet when a file seeds the store); slivers the file
// does not name are removed. An error names the file line.
func (c *Controller) applySlivers(ctx context.Context, path string, seeds []SliverSeed, uplinks map[string]int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	have, _, err := store.ListJSON[intent.Sliver](ctx, c.store, intent.SliversPrefix)
	if err != nil {
		return err
	}
	keep := map[string]bool{}
	for _, s := range seeds {
		keep[s.Host+"/"+s.Name] = true
	}
	for _, s := range have {
		if !keep[s.FullName()] {
			if err := c.store.Delete(ctx, intent.SliverKey(s.Host, s.Name)); err != nil {
				return err
			}
		}
	}
	for _, s := range seeds {
		leases, err := lease.Parse(s.Ports)
		if err != nil {
			return fmt.Errorf("%s:%d: sliver %s: ports %q: %w", path, s.Line, s.Name, s.Ports, err)
		}
		var ups []int
		for k := 0; k < max(uplinks[s.Host], 1); k++ {
			ups = append(ups, k)
		}
		exists := slices.ContainsFunc(have, func(h intent.Sliver) bool { return h.FullName() == s.Host+"/"+s.Name })
		if _, err := c.writeSliver(ctx, s.Host, s.Name, leases, !exists, ups); err != nil {
			return fmt.Errorf("%s:%d: sliver %s: %w", path, s.Line, s.Name, err)
		}
	}
	return nil
}
