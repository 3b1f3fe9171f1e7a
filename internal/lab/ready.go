package lab

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/onehop/onehop/internal/desired"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
)

// Readiness: when a host's datapath is on its vifs. A vif comes up only
// after that, so nothing its VM sends ever reaches the host's own IP stack.

// agentWaitsFor says what host's agent has yet to do before vifs are under
// its datapath, or "" when they are: the agent must have applied the desired
// state the controller now holds for the host (the same digest), that state
// must place each of vifs on the host, and the agent must report each
// attached. With exact, the agent must hold no other vif either (lab up:
// every vif of the host is accounted for). d or st nil: not written yet.
func agentWaitsFor(d *intent.Desired, st *intent.AgentStatus, vifs []string, exact bool) string {
	switch {
	case d == nil:
		return "no desired state from the controller yet"
	case st == nil:
		return "agent has not reported yet"
	case st.Error != "":
		return "agent: " + st.Error
	}
	for _, vif := range vifs {
		if !slices.ContainsFunc(d.Local, func(l intent.LocalEndpoint) bool { return l.Interface == vif }) {
			return fmt.Sprintf("the controller has not placed %s here yet", vif)
		}
	}
	if st.AppliedDigest != d.Digest() {
		return "agent has not applied the latest desired state"
	}
	for _, vif := range vifs {
		if slices.Contains(st.MissingVifs, vif) || !slices.Contains(st.AttachedVifs, vif) {
			return fmt.Sprintf("datapath not yet on %s (attached %d/%d vifs)", vif, len(st.AttachedVifs), len(vifs))
		}
	}
	if exact {
		// Only VMs' vifs count: a sliver's links (s<k>-NAME) are its
		// kind's to wait for. A VM's interface is vif-NAME or the one the
		// desired state names (a topology's interface:).
		notVM := func(ifname string) bool {
			return notVMVif(ifname) && !slices.ContainsFunc(d.Local, func(l intent.LocalEndpoint) bool { return l.Interface == ifname })
		}
		attached := slices.DeleteFunc(slices.Clone(st.AttachedVifs), notVM)
		missing := slices.DeleteFunc(slices.Clone(st.MissingVifs), notVM)
		if len(attached) != len(vifs) || len(missing) > 0 {
			return fmt.Sprintf("datapath on %d vifs, want %d (missing %v)", len(attached), len(vifs), missing)
		}
	}
	return ""
}

// notVMVif tells a sliver's link from a VM's vif in an agent's report.
func notVMVif(ifname string) bool { return !strings.HasPrefix(ifname, intent.VifPrefix) }

// agentReport reads host's desired state and agent status; a status not
// written yet is nil, not an error. A host with no desired key has the
// empty desired state (what its agent applies).
func agentReport(ctx context.Context, s store.Store, host string) (*intent.Desired, *intent.AgentStatus, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var st intent.AgentStatus
	sp := &st
	d, _, err := desired.Read(ctx, s, host)
	if err != nil {
		return nil, nil, fmt.Errorf("desired state of %s: %w", host, err)
	}
	dp := &d
	if err := store.GetJSON(ctx, s, intent.StatusPrefix+host, &st); errors.Is(err, store.ErrNotFound) {
		sp = nil
	} else if err != nil {
		return nil, nil, fmt.Errorf("agent status of %s: %w", host, err)
	}
	return dp, sp, nil
}

// waitVifAttached waits until host's agent reports vif attached (see
// agentWaitsFor) and the kernel shows a program on the vif's tcx ingress,
// for at most timeout. The kernel's word covers an agent report that is
// stale (a VM that moved away and back before the agent noticed). With ip,
// the desired state the agent applied must also serve the VM at ip: a VM
// re-addressed on its own host has its vif listed there all along, under
// its old address until the controller recompiles.
func waitVifAttached(ctx context.Context, st *State, host, vif, ip string, timeout time.Duration) error {
	s, err := dialStore(st)
	if err != nil {
		return err
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	last := ""
	for {
		d, as, err := agentReport(ctx, s, host)
		if err == nil {
			last = agentWaitsFor(d, as, []string{vif}, false)
			if last == "" && ip != "" && !servesAt(d, vif, ip) {
				last = fmt.Sprintf("the controller has not placed %s at %s yet", vif, ip)
			}
		} else {
			last = err.Error()
		}
		if last == "" {
			on, err := tcxAttached(NamespaceOf(st.Name, host), vif)
			switch {
			case err != nil:
				return err
			case on:
				return nil
			}
			last = "the agent reports " + vif + " attached, the kernel shows no program on it yet"
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s's datapath is not on %s after %s (%s); see %s", host, vif, timeout, last, st.Dir)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// servesAt reports whether desired state d has vif's VM at ip.
func servesAt(d *intent.Desired, vif, ip string) bool {
	return slices.ContainsFunc(d.Local, func(l intent.LocalEndpoint) bool { return l.Interface == vif && l.IP == ip })
}
