// Package gateway is the multipath cloud access gateway (A-MPTCP, paper 003):
// it intercepts a user's plain TCP transparently (TPROXY), asks the mapping
// system where the destination lives, and re-opens the connection as MPTCP
// from the gateway's own EIDs with one subflow per usable RLOC, each pinned
// to its own wide-area path, splicing bytes between the two sockets.
//
// The pure parts (configuration, planning subflows from a mapping record,
// nftables rules, status) have no kernel imports; the kernel-touching parts
// (the MPTCP netlink path manager, socket options, policy routing, the
// proxy) are thin and sit behind the interfaces in resolve.go and pin.go so
// the planner and the daemon's bookkeeping test without root.
package gateway

import (
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"time"
)

// MaxPaths is the most subflows one MPTCP connection may have in Linux
// (MPTCP_PM_ADDR_MAX / the `subflows` limit is 8).
const MaxPaths = 8

// Path is one wide-area path out of the gateway: the interface it leaves
// by and the gateway's EID whose subflows are pinned to it.
type Path struct {
	// Name names the path in status and logs (default: Dev).
	Name string `json:"name"`
	// Dev is the interface towards this path's WAN router or xTR.
	Dev string `json:"dev"`
	// EID is the gateway's own address e_i for this path's subflows: the
	// source of every subflow pinned to it (inside the EID prefix).
	EID netip.Addr `json:"eid"`
	// RLOC is the gateway's locator on this path (the outer source when
	// LISP encapsulates); optional in native mode.
	RLOC netip.Addr `json:"rloc,omitzero"`
}

// Config is everything `onehop gateway run` needs; every field comes from a
// flag, and Validate names the flag a bad value came from.
type Config struct {
	// MetricsAddr is the operations port (internal/opsport: /metrics,
	// /healthz, /readyz, /version); empty: none.
	MetricsAddr string
	// Intercept lists the user-facing interfaces whose TCP is intercepted.
	Intercept []string
	// EIDPrefix is the gateway's EID prefix; every path's EID lies in it.
	EIDPrefix netip.Prefix
	// Paths are the wide-area paths, at most MaxPaths.
	Paths []Path
	// ListenPort is the TPROXY listener's port.
	ListenPort uint16
	// MapResolver is the LISP map-resolver (UDP 4342); empty with Static.
	MapResolver netip.AddrPort
	// Static holds mappings given on the command line (--map), used
	// instead of a map-resolver (and before it when both are set).
	Static []Record
	// FWMark marks intercepted packets for the local-delivery table.
	FWMark uint32
	// Table is the routing table delivering marked packets locally; path
	// i's own table is Table+1+i.
	Table int
	// RulePriority is the priority of the first ip rule the gateway adds.
	RulePriority int
	// Congestion is the congestion control of every socket the gateway
	// opens or accepts (TCP_CONGESTION).
	Congestion string
	// Control is the control socket path.
	Control string
	// MaxPerClient bounds one user address's connections (0: no bound):
	// each costs the gateway sockets, subflows and a goroutine pair.
	MaxPerClient int
	// MaxConns bounds the intercepted connections at once, all users
	// together (0: no bound): beyond it one is closed at once and counted
	// (listener_refused_total).
	MaxConns int
	// LISP: encapsulate each path's subflows in LISP (the in-kernel
	// datapath, internal/lispdp) from the path's RLOC to the locator,
	// instead of routing them natively to it.
	LISP bool
	// WholeSuperpackets sends the subflows' TCP superpackets to the xTRs
	// whole instead of segmenting them on the path interfaces: right only
	// when every xTR takes them whole (a kernel with lispdp DecapsGSO, or
	// an xTR run with SiteWholeSuperpackets), as lispdp.RLOCOptions says.
	// It saves the segmenting and a decapsulation and a route per segment
	// of every upload.
	WholeSuperpackets bool
	// MapServer, with MapServerKey and KeyID, is where the gateway
	// registers each path's EID behind that path's RLOC, so that the
	// far xTR sends a subflow's replies back over the subflow's path.
	MapServer    netip.AddrPort
	MapServerKey string
	KeyID        uint8
	// ProbeInterval is how often each locator in use is RLOC-probed over
	// its path (0: no probing); ProbeMisses unanswered probes in a row take
	// it down for that path, as its link going down would.
	ProbeInterval time.Duration
	ProbeMisses   int
	// Infrastructure lists what users are never forwarded to, in any
	// protocol, natively or otherwise: the controller, the map-server,
	// the hosts, the fabric (--infrastructure). MapServer's and
	// MapResolver's addresses are added whatever it says
	// (InfrastructurePrefixes).
	Infrastructure []netip.Prefix
}

// Defaults the flags start from.
const (
	DefaultListenPort   = 15001
	DefaultFWMark       = 0x4f48 // "OH"
	DefaultTable        = 4700
	DefaultRulePriority = 4700
	DefaultCongestion   = "cubic"
	DefaultMaxPerClient = 1024
	// DefaultMaxConns: each connection holds a user socket, an MPTCP
	// socket and its subflows; 16384 stays within a default hard
	// descriptor limit of 524288 with room for everything else.
	DefaultMaxConns = 16384
)

// ParsePath reads one --path value: "dev=IF,eid=ADDR[,rloc=ADDR][,name=NAME]".
func ParsePath(s string) (Path, error) {
	var p Path
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok || v == "" {
			return p, fmt.Errorf("--path %q: %q is not KEY=VALUE (keys: dev, eid, rloc, name)", s, kv)
		}
		var err error
		switch k {
		case "dev":
			p.Dev = v
		case "name":
			p.Name = v
		case "eid":
			if p.EID, err = netip.ParseAddr(v); err != nil {
				return p, fmt.Errorf("--path %q: eid: %w", s, err)
			}
		case "rloc":
			if p.RLOC, err = netip.ParseAddr(v); err != nil {
				return p, fmt.Errorf("--path %q: rloc: %w", s, err)
			}
		default:
			return p, fmt.Errorf("--path %q: unknown key %q (keys: dev, eid, rloc, name)", s, k)
		}
	}
	if p.Dev == "" {
		return p, fmt.Errorf("--path %q: no dev= (the interface towards this path)", s)
	}
	if !p.EID.IsValid() {
		return p, fmt.Errorf("--path %q: no eid= (the gateway's address for this path's subflows)", s)
	}
	if p.Name == "" {
		p.Name = p.Dev
	}
	return p, nil
}

// ParseMap reads one --map value: "PREFIX=RLOC[/PRIORITY[/WEIGHT]],..." or
// "PREFIX=negative" (forwarded natively, as a negative Map-Reply is).
func ParseMap(s string) (Record, error) {
	pfx, locs, ok := strings.Cut(strings.TrimSpace(s), "=")
	if !ok {
		return Record{}, fmt.Errorf("--map %q: want PREFIX=RLOC[/PRIORITY[/WEIGHT]],... or PREFIX=negative", s)
	}
	p, err := netip.ParsePrefix(pfx)
	if err != nil {
		return Record{}, fmt.Errorf("--map %q: prefix: %w", s, err)
	}
	r := Record{EID: p.Masked(), TTL: 0}
	if locs == "negative" {
		r.Negative = true
		return r, nil
	}
	for _, l := range strings.Split(locs, ",") {
		parts := strings.Split(strings.TrimSpace(l), "/")
		if len(parts) > 3 {
			return r, fmt.Errorf("--map %q: locator %q: want RLOC[/PRIORITY[/WEIGHT]]", s, l)
		}
		a, err := netip.ParseAddr(parts[0])
		if err != nil {
			return r, fmt.Errorf("--map %q: locator %q: %w", s, l, err)
		}
		loc := Locator{Addr: a, Priority: 1, Weight: 100}
		if len(parts) > 1 {
			n, err := strconv.ParseUint(parts[1], 10, 8)
			if err != nil {
				return r, fmt.Errorf("--map %q: locator %q: priority: want 0-255", s, l)
			}
			loc.Priority = uint8(n)
		}
		if len(parts) > 2 {
			n, err := strconv.ParseUint(parts[2], 10, 8)
			if err != nil {
				return r, fmt.Errorf("--map %q: locator %q: weight: want 0-255", s, l)
			}
			loc.Weight = uint8(n)
		}
		r.Locators = append(r.Locators, loc)
	}
	return r, nil
}

// Validate checks the configuration and names the flag at fault.
func (c *Config) Validate() error {
	var errs []error
	if len(c.Intercept) == 0 {
		errs = append(errs, errors.New("--intercept: name at least one user-facing interface whose TCP the gateway takes over"))
	}
	if !c.EIDPrefix.IsValid() {
		errs = append(errs, errors.New("--eid-prefix: required (the gateway's EID prefix, e.g. 10.77.0.0/24)"))
	} else if !c.EIDPrefix.Addr().Is4() {
		errs = append(errs, fmt.Errorf("--eid-prefix %s: only IPv4 is supported", c.EIDPrefix))
	}
	switch n := len(c.Paths); {
	case n == 0:
		errs = append(errs, errors.New("--path: give at least one (dev=IF,eid=ADDR[,rloc=ADDR])"))
	case n > MaxPaths:
		errs = append(errs, fmt.Errorf("--path: %d paths, at most %d (the kernel's subflow limit)", n, MaxPaths))
	}
	seenDev, seenEID, seenName := map[string]bool{}, map[netip.Addr]bool{}, map[string]bool{}
	for _, p := range c.Paths {
		if seenDev[p.Dev] {
			errs = append(errs, fmt.Errorf("--path dev=%s: named twice", p.Dev))
		}
		if seenName[p.Name] {
			errs = append(errs, fmt.Errorf("--path name=%s: named twice", p.Name))
		}
		if seenEID[p.EID] {
			errs = append(errs, fmt.Errorf("--path eid=%s: used by two paths (each path needs its own EID)", p.EID))
		}
		seenDev[p.Dev], seenEID[p.EID], seenName[p.Name] = true, true, true
		if !p.EID.Is4() {
			errs = append(errs, fmt.Errorf("--path eid=%s: only IPv4 is supported", p.EID))
		} else if c.EIDPrefix.IsValid() && !c.EIDPrefix.Contains(p.EID) {
			errs = append(errs, fmt.Errorf("--path eid=%s: not inside --eid-prefix %s", p.EID, c.EIDPrefix))
		}
		if p.RLOC.IsValid() && !p.RLOC.Is4() {
			errs = append(errs, fmt.Errorf("--path rloc=%s: only IPv4 is supported", p.RLOC))
		}
		for _, i := range c.Intercept {
			if i == p.Dev {
				errs = append(errs, fmt.Errorf("--intercept %s: is also a --path dev (intercept the user side only)", i))
			}
		}
	}
	if c.ListenPort == 0 {
		errs = append(errs, errors.New("--listen-port: must not be 0"))
	}
	if !c.MapResolver.IsValid() && len(c.Static) == 0 {
		errs = append(errs, errors.New("--map-resolver or --map: the gateway needs a mapping system (a map-resolver ADDR[:4342], or static PREFIX=RLOC,... mappings)"))
	}
	for _, r := range c.Static {
		if !r.EID.Addr().Is4() {
			errs = append(errs, fmt.Errorf("--map %s: only IPv4 EIDs are supported", r.EID))
		}
	}
	if c.FWMark == 0 {
		errs = append(errs, errors.New("--fwmark: must not be 0"))
	}
	if c.Table <= 0 || c.Table+1+len(c.Paths) >= 253 && c.Table < 256 {
		errs = append(errs, fmt.Errorf("--table %d: want a free table number range (Table..Table+%d) clear of 253-255", c.Table, len(c.Paths)))
	}
	if c.RulePriority <= 0 || c.RulePriority+1+len(c.Paths) >= 32766 {
		errs = append(errs, fmt.Errorf("--rule-priority %d: want 1..%d (below the main table's rule)", c.RulePriority, 32765-1-len(c.Paths)))
	}
	if c.LISP {
		for _, p := range c.Paths {
			if !p.RLOC.IsValid() {
				errs = append(errs, fmt.Errorf("--path dev=%s: --lisp needs rloc= (the gateway's locator on the path, the outer source)", p.Dev))
			}
		}
	}
	if c.MapServer.IsValid() && c.MapServerKey == "" {
		errs = append(errs, errors.New("--map-server-key: required with --map-server (Map-Registers are authenticated)"))
	}
	if c.WholeSuperpackets && !c.LISP {
		errs = append(errs, errors.New("--whole-superpackets: only with --lisp (it is about tunnel superpackets)"))
	}
	if c.MapServer.IsValid() && !c.LISP {
		errs = append(errs, errors.New("--map-server: registering the paths' EIDs only makes sense with --lisp"))
	}
	if c.MaxPerClient < 0 {
		errs = append(errs, fmt.Errorf("--max-per-client %d: want 0 (no bound) or more", c.MaxPerClient))
	}
	if c.MaxConns < 0 {
		errs = append(errs, fmt.Errorf("--max-conns %d: want 0 (no bound) or more", c.MaxConns))
	}
	if c.ProbeInterval < 0 || c.ProbeInterval > 0 && c.ProbeInterval < MinProbeInterval {
		errs = append(errs, fmt.Errorf("--rloc-probe-interval %s: want 0 (no probing) or at least %s", c.ProbeInterval, MinProbeInterval))
	}
	if c.ProbeInterval > 0 {
		if c.ProbeMisses < 1 || c.ProbeMisses > MaxProbeMisses {
			errs = append(errs, fmt.Errorf("--rloc-probe-misses %d: want 1 to %d", c.ProbeMisses, MaxProbeMisses))
		}
		for _, p := range c.Paths {
			if !p.RLOC.IsValid() {
				errs = append(errs, fmt.Errorf("--path dev=%s: --rloc-probe-interval needs rloc= (the probes' source and ITR-RLOC on the path)", p.Dev))
			}
		}
	}
	for _, p := range c.Infrastructure {
		if !p.Addr().Is4() {
			errs = append(errs, fmt.Errorf("--infrastructure %s: only IPv4 is supported", p))
		}
	}
	if c.Congestion == "" {
		errs = append(errs, errors.New("--congestion: must name an algorithm (cubic)"))
	}
	return errors.Join(errs...)
}

// ParseInfrastructure reads one --infrastructure value: an IPv4 address or
// prefix.
func ParseInfrastructure(s string) (netip.Prefix, error) {
	s = strings.TrimSpace(s)
	if a, err := netip.ParseAddr(s); err == nil {
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("--infrastructure %q: want an address or a prefix (192.168.100.0/24)", s)
	}
	return p.Masked(), nil
}

// InfrastructurePrefixes is what users are never forwarded to:
// Infrastructure with the map-server's and the map-resolver's addresses,
// each address once, none inside another (nftables refuses overlapping
// intervals in one set), in address order.
func (c *Config) InfrastructurePrefixes() []netip.Prefix {
	all := append([]netip.Prefix(nil), c.Infrastructure...)
	for _, ap := range []netip.AddrPort{c.MapServer, c.MapResolver} {
		if ap.IsValid() && ap.Addr().Unmap().Is4() {
			all = append(all, netip.PrefixFrom(ap.Addr().Unmap(), 32))
		}
	}
	sort.Slice(all, func(i, j int) bool {
		if all[i].Bits() != all[j].Bits() {
			return all[i].Bits() < all[j].Bits() // wider first: they swallow the rest
		}
		return all[i].Addr().Less(all[j].Addr())
	})
	var out []netip.Prefix
	for _, p := range all {
		covered := false
		for _, q := range out {
			if q.Overlaps(p) {
				covered = true // q is as wide or wider
				break
			}
		}
		if !covered {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Addr().Less(out[j].Addr()) })
	return out
}

// PathTable is path i's routing table (native pinning).
func (c *Config) PathTable(i int) int { return c.Table + 1 + i }

// PathByEID returns the index of the path whose EID is a, or -1.
func (c *Config) PathByEID(a netip.Addr) int {
	for i, p := range c.Paths {
		if p.EID == a {
			return i
		}
	}
	return -1
}
