package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/internal/backoff"
)

// LinkEvents is what Interfaces that can report link changes also have: the
// agent attaches a guest's program as soon as its interface appears, not on
// the next resync. Interfaces without it (tests, simulated hosts) rely on
// the resync alone.
type LinkEvents interface {
	// SubscribeLinks sends every link change of the agent's namespace to
	// updates, the links that exist first, until done is closed; a lost
	// subscription calls onError and closes updates.
	SubscribeLinks(updates chan<- netlink.LinkUpdate, done <-chan struct{}, onError func(error)) error
}

// LinkUpper is what Interfaces that can bring a link up also have. A guest's
// interface is made down (a tap QEMU opens, the host end of a veth made
// down): nothing the guest sends enters the host until it is up, and the
// agent brings it up only once its program is attached (docs/guests.md,
// "Before the program is attached").
type LinkUpper interface {
	SetUp(name string) error
}

// linkResubscribe paces subscribing again after a lost subscription.
var linkResubscribe = backoff.Backoff{Initial: 100 * time.Millisecond, Max: 10 * time.Second}

// watchLinks kicks a pass whenever a link appears, goes or is made again
// under its name, until ctx ends. A lost subscription is made again (with
// backoff), and a pass kicked then, since what happened meanwhile is lost.
func (a *Agent) watchLinks(ctx context.Context, src LinkEvents) {
	retry := linkResubscribe.Start(time.Now())
	for {
		since := time.Now()
		err := followLinks(ctx, src, a.kickLinks)
		if ctx.Err() != nil {
			return
		}
		if time.Since(since) > time.Minute {
			retry = linkResubscribe.Start(time.Now()) // it had recovered
		}
		pause, _ := retry.Next(time.Now()) // no limit: it always retries
		a.log.Warn("link watch lost; subscribing again", "err", err, "in", pause)
		if !backoff.Sleep(ctx, pause) {
			return
		}
	}
}

// kickLinks asks the reconcile loop for a pass; kicks that come while one
// waits are one pass.
func (a *Agent) kickLinks() {
	select {
	case a.linkKick <- struct{}{}:
	default:
	}
}

// errLinksEnded is a subscription that closed without saying why.
var errLinksEnded = errors.New("link subscription ended")

// followLinks follows one subscription until it is lost (its error) or ctx
// ends (nil), calling kick once it is made and on every change of which
// link has which name.
func followLinks(ctx context.Context, src LinkEvents, kick func()) error {
	updates := make(chan netlink.LinkUpdate, 256)
	done := make(chan struct{})
	errs := make(chan error, 1)
	err := src.SubscribeLinks(updates, done, func(err error) {
		select {
		case errs <- err:
		default:
		}
	})
	if err != nil {
		return fmt.Errorf("subscribe to link changes: %w", err)
	}
	defer func() {
		close(done)
		// The subscriber may be blocked sending: let it see done.
		go func() {
			for range updates {
			}
		}()
	}()
	kick()
	names := map[int32]string{}
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errs:
			return fmt.Errorf("link changes: %w", err)
		case u, ok := <-updates:
			if !ok {
				return errLinksEnded
			}
			if renamed(names, u) {
				kick()
			}
		}
	}
}

// renamed records in names (by ifindex) what u says and whether a name
// changed hands: a link appeared, went, or was renamed. A change of flags,
// carrier or counters is not: what the agent attaches to is a name's
// ifindex.
func renamed(names map[int32]string, u netlink.LinkUpdate) bool {
	idx := u.Index
	if u.Header.Type == unix.RTM_DELLINK {
		delete(names, idx)
		return true
	}
	name := ""
	if u.Link != nil {
		name = u.Link.Attrs().Name
	}
	if old, ok := names[idx]; ok && old == name {
		return false
	}
	names[idx] = name
	return true
}

// SubscribeLinks implements LinkEvents for the agent's own namespace.
func (LinkTable) SubscribeLinks(updates chan<- netlink.LinkUpdate, done <-chan struct{}, onError func(error)) error {
	return netlink.LinkSubscribeWithOptions(updates, done, netlink.LinkSubscribeOptions{ListExisting: true, ErrorCallback: onError})
}

// SetUp implements LinkUpper.
func (LinkTable) SetUp(name string) error {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return fmt.Errorf("interface %s: %w", name, err)
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return fmt.Errorf("bring %s up: %w", name, err)
	}
	return nil
}

// bringUp brings up each guest interface plan attached that was not
// attached before (by its ifindex): only now may its guest's frames come
// in. An interface up already stays up; one an operator takes down later
// stays down until it is attached again. One that could not be brought up
// is tried again on every pass until it is, as a failed attach is, and the
// pass fails meanwhile. Called by Sync once Apply has attached, before
// locals are replaced.
func (r *Router) bringUp(plan *routerPlan) error {
	if r.up == nil {
		return nil
	}
	pending := map[int]string{}
	var errs []error
	for _, l := range plan.local {
		idx, ok := plan.entries.Attach[l.Interface]
		if !ok || (r.locals[idx].Name == l.Name && r.upPending[idx] != l.Name) {
			continue
		}
		if err := r.up(l.Interface); err != nil {
			if r.upPending[idx] != l.Name { // logged once; the failed pass says the rest
				r.log.Warn("guest interface attached but not brought up; tried again every pass", "interface", l.Interface, "vm", l.Name, "err", err)
			}
			pending[idx] = l.Name
			errs = append(errs, fmt.Errorf("vm %s: %w", l.Name, err))
		}
	}
	r.upPending = pending
	return errors.Join(errs...)
}
