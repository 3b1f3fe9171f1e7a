package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/ratelog"
	"github.com/onehop/onehop/internal/store"
)

// PurgeTable is the part of the mapping table the purger reads and
// forgets; the real one is *datapath.Kernel.
type PurgeTable interface {
	// Mapping is ip's learned host (false: none, or only asked for).
	Mapping(ip netip.Addr) (net.HardwareAddr, bool)
	ForgetMapping(ip netip.Addr) error
}

// MappingPurger forgets the mapping-table entries of VMs that left the
// intent (a delete, or a farm's or subnet's cascade), so that a delete
// leaves no map entry on any host: the datapath learns the table from the
// fabric and would otherwise keep such an entry until it went unused for
// the ARP engine's idle time or its host stopped answering.
//
// It follows the VM records (intent.VMsPrefix, which every agent may read:
// intent.AgentReads) and keeps, of each, only its address and host. An
// entry X -> M is stale when no VM record at X is on the host whose uplink
// MAC is M: nobody holds X any more, or a new VM holds it elsewhere (a
// deleted address re-used), whose own entry is then left alone. Entries of
// addresses a VM still holds on another host than the mapped one (a move)
// are the claim checker's (claims.go), not the purger's.
type MappingPurger struct {
	store store.Store
	table PurgeTable
	log   *slog.Logger
	rl    *ratelog.Logger

	mu      sync.Mutex
	vms     map[string]vmPlace             // VM record key -> where it is
	holders map[netip.Addr]map[string]bool // address -> VM record keys at it
	macs    map[string]net.HardwareAddr    // host -> uplink MAC, from the node records
	// recent are addresses that left the intent lately, until when they
	// are checked again: a packet the deleted VM's host sent before it
	// took the VM out may teach the entry again (uplink.c learns from the
	// fabric's own traffic).
	recent map[netip.Addr]time.Time
	purged uint64
}

// vmPlace is what the purger keeps of a VM record.
type vmPlace struct {
	ip   netip.Addr
	host string
}

// PurgeRecheck is how long an address that left the intent is checked
// again, once a second: longer than its old host takes to reconcile the
// VM away, so nothing that host still sends can leave an entry behind.
const PurgeRecheck = 10 * time.Second

// purgeRecentMax bounds the addresses checked again at once: beyond (a
// cascade of more VMs), an entry taught again after its purge is left to
// the ARP engine's ageing.
const purgeRecentMax = 1 << 14

// NewMappingPurger returns a purger of table's entries; Run starts it.
func NewMappingPurger(s store.Store, table PurgeTable, log *slog.Logger) *MappingPurger {
	return &MappingPurger{store: s, table: table, log: log, rl: ratelog.New(log, 5, time.Second, nil),
		vms: map[string]vmPlace{}, holders: map[netip.Addr]map[string]bool{}, macs: map[string]net.HardwareAddr{},
		recent: map[netip.Addr]time.Time{}}
}

// Run follows the VM records until ctx ends: it lists them (Load), then
// takes what the watch reports (Take), and lists again when the watch is
// lost. Once a second it checks again the addresses that left lately.
func (p *MappingPurger) Run(ctx context.Context) {
	for ctx.Err() == nil {
		rev, err := p.Load(ctx)
		if err == nil {
			err = p.follow(ctx, rev)
		}
		if ctx.Err() != nil {
			return
		}
		p.rl.Warn("purge", "mapping purger: VM records not followed; listing them again in a second", "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// follow takes the watch's batches from revision rev until it breaks.
func (p *MappingPurger) follow(ctx context.Context, rev int64) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	events := p.store.WatchEvents(wctx, intent.VMsPrefix, rev)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			if err := p.Recheck(ctx, time.Now()); err != nil {
				p.rl.Warn("recheck", "mapping purger: recheck", "err", err)
			}
		case b, ok := <-events:
			if !ok {
				return errWatchEnded
			}
			if b.Err != nil {
				return b.Err
			}
			if err := p.Take(ctx, b.Events); err != nil {
				p.rl.Warn("take", "mapping purger", "err", err)
			}
		}
	}
}

// Load reads every VM and node record and returns the revision it read the
// VM records at. Listing again after a lost watch, it forgets, as Take
// does, the entries of the addresses that left the intent meanwhile: held
// by a VM at the last list or event, by none now. The first list forgets
// nothing: what left before the agent followed the records is left to the
// ARP engine's ageing, as every entry of a table a test or a former agent
// filled from no intent.
func (p *MappingPurger) Load(ctx context.Context) (int64, error) {
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	kvs, rev, err := p.store.List(lctx, intent.VMsPrefix)
	if err != nil {
		return 0, fmt.Errorf("read VM records: %w", err)
	}
	nodes, _, err := store.ListJSON[intent.Node](lctx, p.store, intent.NodesPrefix)
	if err != nil {
		return 0, fmt.Errorf("read node records: %w", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	before := p.vms
	p.vms, p.holders, p.macs = map[string]vmPlace{}, map[netip.Addr]map[string]bool{}, map[string]net.HardwareAddr{}
	for _, n := range nodes {
		if mac, err := net.ParseMAC(n.UplinkMAC); err == nil {
			p.macs[n.Name] = mac
		}
	}
	for k, v := range kvs {
		p.setLocked(k, v)
	}
	left := map[netip.Addr]bool{}
	for k, old := range before {
		if now, ok := p.vms[k]; !ok || now.ip != old.ip {
			left[old.ip] = true
		}
	}
	return rev, p.leftLocked(ctx, left, "the VM was deleted while the watch was lost")
}

// Take applies watched changes of VM records and forgets the entries they
// made stale: those of the addresses VMs left, unless a VM of the intent
// is at that address on the mapped host.
func (p *MappingPurger) Take(ctx context.Context, events []store.Event) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	left := map[netip.Addr]bool{}
	for _, e := range events {
		old, had := p.vms[e.Key]
		if e.Deleted {
			p.dropLocked(e.Key)
		} else {
			p.setLocked(e.Key, e.Value)
		}
		if now, ok := p.vms[e.Key]; had && (!ok || now.ip != old.ip) {
			left[old.ip] = true
		}
	}
	return p.leftLocked(ctx, left, "the VM was deleted")
}

// leftLocked forgets the entries of the addresses VMs left (purgeLocked)
// and checks them again for PurgeRecheck.
func (p *MappingPurger) leftLocked(ctx context.Context, left map[netip.Addr]bool, why string) error {
	now := time.Now()
	var errs []error
	var forgot []netip.Addr
	for ip := range left {
		if len(p.holders[ip]) == 0 && len(p.recent) < purgeRecentMax {
			p.recent[ip] = now.Add(PurgeRecheck)
		}
		errs = append(errs, p.purgeLocked(ctx, ip, &forgot))
	}
	p.logForgot(forgot, why)
	return errors.Join(errs...)
}

// Recheck forgets, as Take does, the entries of addresses that left the
// intent less than PurgeRecheck before now and were taught again since.
func (p *MappingPurger) Recheck(ctx context.Context, now time.Time) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	var forgot []netip.Addr
	for ip, until := range p.recent {
		if !now.Before(until) || len(p.holders[ip]) > 0 {
			delete(p.recent, ip)
			continue
		}
		errs = append(errs, p.purgeLocked(ctx, ip, &forgot))
	}
	p.logForgot(forgot, "taught again by the deleted VM's host")
	return errors.Join(errs...)
}

// Purged is how many learned entries the purger forgot.
func (p *MappingPurger) Purged() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.purged
}

// purgeLocked forgets ip's learned entry unless a VM record at ip is on
// the host it maps to.
func (p *MappingPurger) purgeLocked(ctx context.Context, ip netip.Addr, forgot *[]netip.Addr) error {
	mac, ok := p.table.Mapping(ip)
	if !ok {
		return nil
	}
	for key := range p.holders[ip] {
		if bytes.Equal(p.macLocked(ctx, p.vms[key].host), mac) {
			return nil // the VM holding the address now: its entry wins
		}
	}
	return p.forgetLocked(ip, forgot)
}

// forgetLocked forgets ip's entry and adds it to forgot, what the call
// that caused it logs.
func (p *MappingPurger) forgetLocked(ip netip.Addr, forgot *[]netip.Addr) error {
	if err := p.table.ForgetMapping(ip); err != nil {
		return err
	}
	p.purged++
	*forgot = append(*forgot, ip)
	return nil
}

// logForgot logs, at most a few lines a second, what one call forgot.
func (p *MappingPurger) logForgot(forgot []netip.Addr, why string) {
	if len(forgot) == 0 {
		return
	}
	shown := forgot[:min(len(forgot), 8)]
	p.rl.Info("forgot", "mappings of VMs that left the intent forgotten", "count", len(forgot), "vms", shown, "why", why)
}

// macLocked is host's uplink MAC: from the node records as listed, or
// read once more for a host that joined since (nil: none known).
func (p *MappingPurger) macLocked(ctx context.Context, host string) net.HardwareAddr {
	if mac, ok := p.macs[host]; ok {
		return mac
	}
	mac, err := nodeUplinkMAC(ctx, p.store, host)
	if err != nil {
		return nil
	}
	p.macs[host] = mac
	return mac
}

// setLocked records the VM record key = v; one that does not decode holds
// no address.
func (p *MappingPurger) setLocked(key string, v []byte) {
	p.dropLocked(key)
	var vm intent.VM
	if err := json.Unmarshal(v, &vm); err != nil {
		p.rl.Warn("record", "mapping purger: VM record", "key", key, "err", err)
		return
	}
	ip, err := netip.ParseAddr(vm.IP)
	if err != nil {
		return // not placed yet, or broken: no address to hold
	}
	p.vms[key] = vmPlace{ip: ip, host: vm.Host}
	if p.holders[ip] == nil {
		p.holders[ip] = map[string]bool{}
	}
	p.holders[ip][key] = true
	delete(p.recent, ip)
}

func (p *MappingPurger) dropLocked(key string) {
	old, ok := p.vms[key]
	if !ok {
		return
	}
	delete(p.vms, key)
	delete(p.holders[old.ip], key)
	if len(p.holders[old.ip]) == 0 {
		delete(p.holders, old.ip)
	}
}

// nodeUplinkMAC is the uplink MAC host's node record gives (an error
// wrapping store.ErrNotFound when it has none, errBadUplinkMAC when its
// MAC does not parse).
func nodeUplinkMAC(ctx context.Context, s store.Store, host string) (net.HardwareAddr, error) {
	var n intent.Node
	if err := store.GetJSON(ctx, s, intent.NodesPrefix+host, &n); err != nil {
		return nil, fmt.Errorf("node record of %s: %w", host, err)
	}
	mac, err := net.ParseMAC(n.UplinkMAC)
	if err != nil || len(mac) != 6 {
		return nil, fmt.Errorf("%w: node %s: uplink MAC %q is not an Ethernet address", errBadUplinkMAC, host, n.UplinkMAC)
	}
	return mac, nil
}

// errBadUplinkMAC marks a node record whose uplink MAC does not parse.
var errBadUplinkMAC = errors.New("bad node record")
