package gateway

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Pinner makes the subflows from a path's EID travel over that path. The
// native pinner routes by source address; the LISP datapath encapsulates
// to the path's RLOC pair instead.
type Pinner interface {
	// Pin makes packets from path's EID to rec's EID prefix leave over
	// path towards rec's locator loc.
	Pin(path int, rec Record, loc netip.Addr) error
	// Repin re-installs what was pinned on path (its link came back and
	// the kernel flushed its routes).
	Repin(path int) error
	// Close removes everything the pinner installed.
	Close() error
}

// Routes is the gateway's policy routing: the TPROXY local-delivery table
// and one table per path selected by the path's EID as source (the native
// pinner). It remembers what it added and removes exactly that on Close.
type Routes struct {
	cfg *Config

	mu     sync.Mutex
	rules  []*netlink.Rule
	addrs  []netlink.Addr
	pinned map[int]map[netip.Prefix]netip.Addr
	tables []int
}

// NewRoutes installs the TPROXY delivery rule and table, the paths' EIDs on
// lo and each path's source rule and table (which ends in an unreachable
// default: a subflow whose path has no route fails rather than leaking onto
// another path by the main table).
func NewRoutes(cfg *Config) (_ *Routes, err error) {
	r := &Routes{cfg: cfg, pinned: map[int]map[netip.Prefix]netip.Addr{}}
	defer func() {
		if err != nil {
			err = errors.Join(err, r.Close())
		}
	}()
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return r, fmt.Errorf("routes: lo: %w", err)
	}
	/* TPROXY: marked packets are delivered locally (table T: local 0/0 dev lo) */
	r.tables = append(r.tables, cfg.Table)
	if err := netlink.RouteReplace(&netlink.Route{
		Type: unix.RTN_LOCAL, Dst: &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)},
		LinkIndex: lo.Attrs().Index, Table: cfg.Table, Scope: netlink.SCOPE_HOST,
	}); err != nil {
		return r, fmt.Errorf("routes: local default in table %d: %w", cfg.Table, err)
	}
	rule := netlink.NewRule()
	rule.Mark, rule.Table, rule.Priority, rule.Family = cfg.FWMark, cfg.Table, cfg.RulePriority, unix.AF_INET
	mask := uint32(0xffffffff)
	rule.Mask = &mask
	if err := r.addRule(rule); err != nil {
		return r, err
	}
	existing, err := netlink.AddrList(lo, unix.AF_INET)
	if err != nil {
		return r, fmt.Errorf("routes: addresses of lo: %w", err)
	}
	for i, p := range cfg.Paths {
		have := false
		for _, a := range existing {
			if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok && ip == p.EID {
				have = true
			}
		}
		if !have {
			a := netlink.Addr{IPNet: &net.IPNet{IP: p.EID.AsSlice(), Mask: net.CIDRMask(32, 32)}}
			if err := netlink.AddrAdd(lo, &a); err != nil {
				return r, fmt.Errorf("routes: --path eid=%s on lo: %w", p.EID, err)
			}
			r.addrs = append(r.addrs, a)
		}
		t := cfg.PathTable(i)
		r.tables = append(r.tables, t)
		if err := netlink.RouteReplace(&netlink.Route{
			Type: unix.RTN_UNREACHABLE, Dst: &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)},
			Table: t, Priority: 0xffffffff,
		}); err != nil {
			return r, fmt.Errorf("routes: unreachable default in table %d: %w", t, err)
		}
		rule := netlink.NewRule()
		rule.Src = &net.IPNet{IP: p.EID.AsSlice(), Mask: net.CIDRMask(32, 32)}
		rule.Table, rule.Priority, rule.Family = t, cfg.RulePriority+1+i, unix.AF_INET
		if err := r.addRule(rule); err != nil {
			return r, err
		}
	}
	return r, nil
}

func (r *Routes) addRule(rule *netlink.Rule) error {
	if err := netlink.RuleAdd(rule); err != nil && !errors.Is(err, os.ErrExist) && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("routes: ip rule %s: %w", rule, err)
	}
	r.rules = append(r.rules, rule)
	return nil
}

// Pin implements Pinner: dst via loc (or loc's next hop) in path's table.
func (r *Routes) Pin(path int, rec Record, loc netip.Addr) error {
	return r.PinPrefix(path, rec.EID, loc)
}

// PinPrefix routes dst via loc (or loc's next hop) in path's table.
func (r *Routes) PinPrefix(path int, dst netip.Prefix, loc netip.Addr) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.pin(path, dst, loc); err != nil {
		return err
	}
	if r.pinned[path] == nil {
		r.pinned[path] = map[netip.Prefix]netip.Addr{}
	}
	r.pinned[path][dst] = loc
	return nil
}

func (r *Routes) pin(path int, dst netip.Prefix, loc netip.Addr) error {
	p := r.cfg.Paths[path]
	link, err := netlink.LinkByName(p.Dev)
	if err != nil {
		return fmt.Errorf("pin %s over %s: %w", dst, p.Name, err)
	}
	gw := loc
	if rs, err := netlink.RouteGet(loc.AsSlice()); err == nil && len(rs) > 0 && rs[0].Gw != nil && rs[0].LinkIndex == link.Attrs().Index {
		gw, _ = netip.AddrFromSlice(rs[0].Gw.To4())
	}
	rt := &netlink.Route{
		Dst:       &net.IPNet{IP: dst.Addr().AsSlice(), Mask: net.CIDRMask(dst.Bits(), 32)},
		Gw:        gw.AsSlice(),
		LinkIndex: link.Attrs().Index,
		Table:     r.cfg.PathTable(path),
	}
	if r.cfg.LISP {
		/* encapsulation adds 36 bytes: with the route's MTU lowered, TCP
		   advertises and sends segments that fit unchanged */
		rt.MTU = link.Attrs().MTU - lispOverhead
	}
	if err := netlink.RouteReplace(rt); err != nil {
		return fmt.Errorf("pin %s via %s dev %s table %d: %w", dst, gw, p.Dev, rt.Table, err)
	}
	return nil
}

// Repin implements Pinner.
func (r *Routes) Repin(path int) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var errs []error
	for dst, loc := range r.pinned[path] {
		errs = append(errs, r.pin(path, dst, loc))
	}
	return errors.Join(errs...)
}

// Close implements Pinner: removes the rules, the tables' routes and the
// EIDs it added.
func (r *Routes) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var errs []error
	for _, rule := range r.rules {
		if err := netlink.RuleDel(rule); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("routes: delete ip rule %s: %w", rule, err))
		}
	}
	r.rules = nil
	for _, t := range r.tables {
		rs, err := netlink.RouteListFiltered(unix.AF_INET, &netlink.Route{Table: t}, netlink.RT_FILTER_TABLE)
		if err != nil {
			errs = append(errs, fmt.Errorf("routes: list table %d: %w", t, err))
			continue
		}
		for _, rt := range rs {
			if err := netlink.RouteDel(&rt); err != nil && !errors.Is(err, unix.ESRCH) {
				errs = append(errs, fmt.Errorf("routes: delete %s from table %d: %w", rt, t, err))
			}
		}
	}
	r.tables = nil
	if len(r.addrs) > 0 {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			errs = append(errs, err)
		} else {
			for _, a := range r.addrs {
				if err := netlink.AddrDel(lo, &a); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
					errs = append(errs, fmt.Errorf("routes: delete %s from lo: %w", a.IPNet, err))
				}
			}
		}
		r.addrs = nil
	}
	return errors.Join(errs...)
}

// RouteFinder is the PathFinder of the running system: the path whose
// interface the main table's route to the RLOC leaves by.
func RouteFinder(cfg *Config) PathFinder {
	return func(rloc netip.Addr) (int, bool) {
		rs, err := netlink.RouteGet(rloc.AsSlice())
		if err != nil || len(rs) == 0 {
			return 0, false
		}
		l, err := netlink.LinkByIndex(rs[0].LinkIndex)
		if err != nil {
			return 0, false
		}
		for i, p := range cfg.Paths {
			if p.Dev == l.Attrs().Name {
				return i, true
			}
		}
		return 0, false
	}
}

// WriteSysctl sets a sysctl of the caller's network namespace and returns
// the value it had.
func WriteSysctl(key, value string) (string, error) {
	p := "/proc/sys/" + strings.ReplaceAll(key, ".", "/")
	old, err := os.ReadFile(p)
	if err != nil {
		return "", fmt.Errorf("sysctl %s: %w", key, err)
	}
	if err := os.WriteFile(p, []byte(value), 0o644); err != nil {
		return "", fmt.Errorf("sysctl %s=%s: %w", key, value, err)
	}
	return strings.TrimSpace(string(old)), nil
}
