package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/onehop/onehop/internal/arpengine"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
)

// MappingPointer moves a mapping-table entry to another host; the real one
// is *datapath.Kernel.
type MappingPointer interface {
	PointMapping(ip netip.Addr, host net.HardwareAddr, now uint64) error
}

// ClaimChecker decides the claims the datapath hands over: a known host says
// it holds a VM this host maps to another (an announcement after a move, or
// an answer from a host other than the mapped one). The datapath never moves
// an entry itself; the checker moves it only when the store, the
// controller's intent, places the VM on the claiming host, so no host, lying
// or mistaken, can draw another host's traffic to itself.
type ClaimChecker struct {
	store store.Store
	table MappingPointer
	now   func() time.Duration // the datapath's clock (CLOCK_MONOTONIC)
	log   *slog.Logger
	queue chan arpengine.Answer
	// ask sends the claimant a question about the VM once its entry moved:
	// its answer confirms the entry (counted as arp_learned), so a host that
	// claims but does not answer is noticed by the next refresh.
	ask func(vm netip.Addr, host net.HardwareAddr)

	mu                sync.Mutex
	accepted, refused uint64
	logWindow         time.Time
	logged            int
}

// claimQueue bounds the claims waiting for the store; the datapath already
// sends at most one a second per address, and a claim dropped here is made
// again at the claiming host's next announcement or this host's next refresh.
const claimQueue = 256

// claimLogBurst bounds the log lines claims cause per second.
const claimLogBurst = 10

// NewClaimChecker returns a checker; Run starts it. ask (may be nil) sends
// a question about a VM to one host.
func NewClaimChecker(s store.Store, table MappingPointer, now func() time.Duration,
	ask func(vm netip.Addr, host net.HardwareAddr), log *slog.Logger) *ClaimChecker {
	return &ClaimChecker{store: s, table: table, now: now, ask: ask, log: log, queue: make(chan arpengine.Answer, claimQueue)}
}

// Claim queues a claim without waiting; it reports false when the queue is
// full and the claim was dropped.
func (c *ClaimChecker) Claim(a arpengine.Answer) bool {
	select {
	case c.queue <- a:
		return true
	default:
		c.mu.Lock()
		c.refused++
		c.mu.Unlock()
		return false
	}
}

// Run checks queued claims until ctx ends.
func (c *ClaimChecker) Run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case a := <-c.queue:
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err := c.Check(cctx, a)
			cancel()
			if err != nil && ctx.Err() == nil {
				c.logf(slog.LevelWarn, "mapping claim not checked", "vm", a.VM, "host", a.HostMAC, "err", err)
			}
		}
	}
}

// errRefused marks a claim the store does not back.
var errRefused = errors.New("refused")

// Check decides one claim: the entry moves to the claiming host only if the
// store's VM record places the VM on a node whose uplink MAC is the
// claimant's. It reports whether the entry moved; a refusal is no error.
func (c *ClaimChecker) Check(ctx context.Context, a arpengine.Answer) (bool, error) {
	host, err := c.holder(ctx, a.VM)
	switch {
	case errors.Is(err, errRefused):
		c.count(false)
		c.logf(slog.LevelWarn, "mapping claim refused: the store does not place the VM on the claiming host",
			"vm", a.VM, "claimant", a.HostMAC, "why", err)
		return false, nil
	case err != nil:
		return false, err
	case !bytes.Equal(host, a.HostMAC):
		c.count(false)
		c.logf(slog.LevelWarn, "mapping claim refused: the store places the VM on another host",
			"vm", a.VM, "claimant", a.HostMAC, "holder", host)
		return false, nil
	}
	if err := c.table.PointMapping(a.VM, a.HostMAC, uint64(c.now())); err != nil {
		return false, err
	}
	c.count(true)
	c.logf(slog.LevelInfo, "VM moved: mapping follows the store", "vm", a.VM, "host", a.HostMAC)
	if c.ask != nil {
		c.ask(a.VM, a.HostMAC)
	}
	return true, nil
}

// holder is the uplink MAC of the node the store places vm on.
func (c *ClaimChecker) holder(ctx context.Context, vm netip.Addr) (net.HardwareAddr, error) {
	vms, _, err := store.ListJSON[intent.VM](ctx, c.store, intent.VMsPrefix)
	if err != nil {
		return nil, fmt.Errorf("read VM records: %w", err)
	}
	for _, v := range vms {
		if v.IP != vm.String() {
			continue
		}
		mac, err := nodeUplinkMAC(ctx, c.store, v.Host)
		switch {
		case errors.Is(err, store.ErrNotFound):
			return nil, fmt.Errorf("%w: host %s of %s has no node record", errRefused, v.Host, v.FullName())
		case errors.Is(err, errBadUplinkMAC):
			return nil, fmt.Errorf("%w: %w", errRefused, err)
		}
		return mac, err
	}
	return nil, fmt.Errorf("%w: no VM has address %s", errRefused, vm)
}

// Counts returns how many claims moved an entry and how many were refused.
func (c *ClaimChecker) Counts() (accepted, refused uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.accepted, c.refused
}

func (c *ClaimChecker) count(ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ok {
		c.accepted++
	} else {
		c.refused++
	}
}

// logf logs at most claimLogBurst lines a second: claims come from other
// hosts, and a host may be made to send many.
func (c *ClaimChecker) logf(level slog.Level, msg string, args ...any) {
	c.mu.Lock()
	now := time.Now()
	if now.Sub(c.logWindow) >= time.Second {
		c.logWindow, c.logged = now, 0
	}
	c.logged++
	over := c.logged > claimLogBurst
	c.mu.Unlock()
	if !over {
		c.log.Log(context.Background(), level, msg, args...)
	}
}
