package lab

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/netns"
	"github.com/onehop/onehop/internal/topology"
)

// AddSliver builds sliver s in lab st, which is up: `onehop sliver create`
// calls it once the controller holds the sliver. Like lab up, it makes the
// sliver's namespace, cgroup and links, and brings the host-side links up
// only once the host's agent has its datapath on them (at most
// moveTimeout); then the links are left down and the error says so. What
// it cannot build is removed again.
func AddSliver(st *State, s intent.Sliver) error {
	if k, taken := st.Kinds[s.Name]; taken {
		return fmt.Errorf("lab %q already has a node %q (a %s); sliver names are unique in a lab", st.Name, s.Name, k)
	}
	// VMs of several farms named alike are nodes FARM/VM; their name is
	// still theirs (`lab exec NAME` lists them), not a sliver's.
	for _, v := range st.VMs {
		if v.Name == s.Name {
			return fmt.Errorf("lab %q already has a VM named %q (%s); sliver names are unique in a lab", st.Name, s.Name, v.FullName())
		}
	}
	if netns.Exists(NamespaceOf(st.Name, s.Name)) {
		return fmt.Errorf("namespace %s already exists", NamespaceOf(st.Name, s.Name))
	}
	if err := plumbSliver(st, s); err != nil {
		if rerr := RemoveSliver(st, s.Host, s.Name); rerr != nil {
			err = errors.Join(err, fmt.Errorf("and removing what was built: %w", rerr))
		}
		return err
	}
	datapath := st.Datapath != topology.DatapathBridge
	if datapath {
		if err := waitSliverAttached(context.Background(), st, s, moveTimeout); err != nil {
			return fmt.Errorf("sliver %s plumbed, its links left down: %w", s.FullName(), err)
		}
	}
	return activateSliver(st, s, datapath)
}

// waitSliverAttached waits until the host's datapath is on every link of s
// (sliverNotReady), for at most timeout.
func waitSliverAttached(ctx context.Context, st *State, s intent.Sliver, timeout time.Duration) error {
	conn, err := dialStore(st)
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		d, as, err := agentReport(ctx, conn, s.Host)
		last := ""
		if err != nil {
			last = err.Error()
		} else if last, err = sliverNotReady(st, d, as, s.Host, s.Name, sliverLinks(s)); err != nil {
			return err
		}
		if last == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s's datapath is not on sliver %s after %s (%s); see %s", s.Host, s.Name, timeout, last, st.Dir)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// RemoveSliver removes sliver name of host from lab st: `onehop sliver
// delete` calls it. It kills what runs in the sliver's cgroup and removes
// the cgroup, its links and its namespace, and forgets the sliver. A sliver
// the lab does not have is an error only if nothing of it is left either.
func RemoveSliver(st *State, host, name string) error {
	idx := slices.IndexFunc(st.Slivers, func(s intent.Sliver) bool { return s.Name == name })
	ns := NamespaceOf(st.Name, name)
	if idx >= 0 && st.Slivers[idx].Host != host {
		return fmt.Errorf("sliver %s of lab %q is on host %s, not %s", name, st.Name, st.Slivers[idx].Host, host)
	}
	if idx < 0 && st.Kinds[name] != "sliver" && !netns.Exists(ns) {
		return fmt.Errorf("lab %q has no sliver %s/%s", st.Name, host, name)
	}
	var errs []error
	// Its processes first: one left alive would keep the namespace, and
	// with it the links, after the namespace's name is gone.
	if st.CgroupFS != "" {
		if err := removeCgroup(SliverCgroupDir(st, host, name)); err != nil {
			errs = append(errs, err)
		}
	}
	// The host-side links go with their peers; removed here too, so that
	// a namespace kept alive by a process outside the cgroup (an `ip netns
	// exec` shell) leaves no link on the host.
	if err := removeSliverLinks(NamespaceOf(st.Name, host), name); err != nil {
		errs = append(errs, err)
	}
	if err := netns.Delete(ns); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if idx >= 0 {
		st.Slivers = slices.Delete(st.Slivers, idx, idx+1)
	}
	st.Namespaces = slices.DeleteFunc(st.Namespaces, func(n string) bool { return n == ns })
	delete(st.Kinds, name)
	return st.save()
}

// removeSliverLinks deletes the host-side links of sliver on every uplink
// in host namespace hostNS; missing ones are fine.
func removeSliverLinks(hostNS, sliver string) error {
	if !netns.Exists(hostNS) {
		return nil
	}
	h, err := netns.Handle(hostNS)
	if err != nil {
		return err
	}
	defer h.Close()
	for k := 0; k < topology.MaxUplinks; k++ {
		l, err := h.LinkByName(intent.SliverIfname(sliver, k))
		var missing netlink.LinkNotFoundError
		if errors.As(err, &missing) {
			continue
		}
		if err != nil {
			return fmt.Errorf("%s in %s: %w", intent.SliverIfname(sliver, k), hostNS, err)
		}
		if err := h.LinkDel(l); err != nil {
			return fmt.Errorf("remove %s in %s: %w", l.Attrs().Name, hostNS, err)
		}
	}
	return nil
}
