// Package xtr is the data center's LISP tunnel router (paper 003's xTR):
// it puts the in-kernel LISP data plane (internal/lispdp) on the router's
// WAN links (one RLOC each) and on its site-facing links, registers the
// site's EID prefixes behind every RLOC with authenticated Map-Registers
// (RFC 9301 §8.2), and installs the mappings its replies need (the access
// gateway's per-path EIDs) by asking the map-resolver when a remote EID
// first opens a connection, and again whenever a record's TTL runs out.
//
// The pure parts (configuration, the registered records, turning a
// Map-Reply into datapath tunnels, the refresh schedule, reading a sniffed
// frame) have no kernel imports; run.go is the thin kernel-touching part.
package xtr

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/onehop/onehop/internal/lisp"
)

// RLOC is one WAN link of the xTR: the interface and the locator on it.
type RLOC struct {
	// Dev is the interface towards this path.
	Dev string `json:"dev"`
	// Addr is the locator; the interface's first IPv4 address when not
	// given.
	Addr netip.Addr `json:"addr,omitzero"`
	// Priority and Weight are what the registration announces for it
	// (lower priority is preferred, 255 = do not use; weight shares equal
	// priorities).
	Priority uint8 `json:"priority"`
	Weight   uint8 `json:"weight"`
}

// Config is everything `onehop xtr run` needs; Validate names the flag a
// bad value came from.
type Config struct {
	RLOCs       []RLOC
	EIDDevs     []string
	EIDPrefixes []netip.Prefix
	MapServer   netip.AddrPort
	// MapResolver defaults to MapServer.
	MapResolver netip.AddrPort
	KeyID       uint8
	Key         []byte
	// TTL is the registered records' TTL (whole minutes on the wire).
	TTL time.Duration
	// RegisterInterval is how often the registration is refreshed.
	RegisterInterval time.Duration
	// WholeSuperpackets sends TCP superpackets to the far ends of the
	// RLOC links whole instead of segmenting them here: right only when
	// every far end terminates what it decapsulates (access gateways), as
	// lispdp.RLOCOptions says; it saves the gateway ~3.5x CPU per GiB.
	WholeSuperpackets bool
	// SiteWholeSuperpackets takes the gateways' TCP superpackets whole and
	// routes them to the EIDDevs whole: right only when every EIDDev is a
	// veth into a namespace of this host whose own sockets terminate the
	// traffic (servers, as in the lab), as lispdp.EIDOptions says. The
	// gateways may then send superpackets whole (gateway.Config.
	// WholeSuperpackets) instead of segmenting every upload.
	SiteWholeSuperpackets bool
	// MetricsAddr is the operations port (internal/opsport: /metrics,
	// /healthz, /readyz, /version); empty: none.
	MetricsAddr string
}

// Defaults the flags start from.
const (
	DefaultTTL              = 10 * time.Minute
	DefaultRegisterInterval = lisp.DefaultRegisterInterval
	DefaultPriority         = 1
	DefaultWeight           = 50
	// MaxRLOCs: a path id is a byte, and an RLOC is one path per remote
	// locator; 8 WAN links is already more than MPTCP can use.
	MaxRLOCs = 8
)

// ParseRLOC reads one --rloc value: "IF[,addr=ADDR][,priority=P][,weight=W]".
func ParseRLOC(s string) (RLOC, error) {
	r := RLOC{Priority: DefaultPriority, Weight: DefaultWeight}
	parts := strings.Split(s, ",")
	r.Dev = strings.TrimSpace(parts[0])
	if r.Dev == "" || strings.Contains(r.Dev, "=") {
		return r, fmt.Errorf("--rloc %q: want IF[,addr=ADDR][,priority=P][,weight=W], the interface first", s)
	}
	for _, kv := range parts[1:] {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok || v == "" {
			return r, fmt.Errorf("--rloc %q: %q is not KEY=VALUE (keys: addr, priority, weight)", s, kv)
		}
		switch k {
		case "addr":
			a, err := netip.ParseAddr(v)
			if err != nil || !a.Is4() {
				return r, fmt.Errorf("--rloc %q: addr %q is not an IPv4 address", s, v)
			}
			r.Addr = a
		case "priority", "weight":
			n, err := strconv.ParseUint(v, 10, 8)
			if err != nil {
				return r, fmt.Errorf("--rloc %q: %s %q: want 0-255", s, k, v)
			}
			if k == "priority" {
				r.Priority = uint8(n)
			} else {
				r.Weight = uint8(n)
			}
		default:
			return r, fmt.Errorf("--rloc %q: unknown key %q (keys: addr, priority, weight)", s, k)
		}
	}
	return r, nil
}

// ParseServer reads ADDR or ADDR:PORT (default port 4342) for flag.
func ParseServer(flag, s string) (netip.AddrPort, error) {
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap, nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil || !a.Is4() {
		return netip.AddrPort{}, fmt.Errorf("%s %q: want an IPv4 ADDR or ADDR:PORT", flag, s)
	}
	return netip.AddrPortFrom(a, 4342), nil
}

// Validate checks the configuration and names the flag of each mistake.
func (c *Config) Validate() error {
	var errs []error
	if len(c.RLOCs) == 0 {
		errs = append(errs, errors.New("--rloc: at least one WAN interface is needed"))
	}
	if len(c.RLOCs) > MaxRLOCs {
		errs = append(errs, fmt.Errorf("--rloc: %d given, at most %d", len(c.RLOCs), MaxRLOCs))
	}
	devs := map[string]string{}
	addrs := map[netip.Addr]bool{}
	for _, r := range c.RLOCs {
		if prev, ok := devs[r.Dev]; ok {
			errs = append(errs, fmt.Errorf("--rloc %s: interface given twice (also %s)", r.Dev, prev))
		}
		devs[r.Dev] = "--rloc"
		if r.Addr.IsValid() {
			if addrs[r.Addr] {
				errs = append(errs, fmt.Errorf("--rloc %s: addr %s given twice", r.Dev, r.Addr))
			}
			addrs[r.Addr] = true
		}
	}
	if len(c.EIDDevs) == 0 {
		errs = append(errs, errors.New("--eid-dev: at least one site-facing interface is needed"))
	}
	for _, d := range c.EIDDevs {
		if prev, ok := devs[d]; ok {
			errs = append(errs, fmt.Errorf("--eid-dev %s: interface already given as %s", d, prev))
		}
		devs[d] = "--eid-dev"
	}
	if len(c.EIDPrefixes) == 0 {
		errs = append(errs, errors.New("--eid-prefix: the site's EID prefix is needed"))
	}
	for i, p := range c.EIDPrefixes {
		if !p.Addr().Is4() {
			errs = append(errs, fmt.Errorf("--eid-prefix %s: IPv4 only", p))
		}
		for _, q := range c.EIDPrefixes[:i] {
			if p.Overlaps(q) {
				errs = append(errs, fmt.Errorf("--eid-prefix %s overlaps %s", p, q))
			}
		}
	}
	if !c.MapServer.IsValid() {
		errs = append(errs, errors.New("--map-server: the map-server to register with is needed"))
	}
	if len(c.Key) < 8 {
		errs = append(errs, fmt.Errorf("--key-file: the key has %d bytes, want at least 8", len(c.Key)))
	}
	if c.TTL < time.Minute || c.TTL%time.Minute != 0 {
		errs = append(errs, fmt.Errorf("--ttl %s: want whole minutes, at least 1m", c.TTL))
	}
	if c.RegisterInterval < time.Second {
		errs = append(errs, fmt.Errorf("--register-interval %s: want at least 1s", c.RegisterInterval))
	}
	if c.TTL > 0 && c.RegisterInterval >= c.TTL {
		errs = append(errs, fmt.Errorf("--register-interval %s: must be shorter than --ttl %s, or the registration lapses", c.RegisterInterval, c.TTL))
	}
	return errors.Join(errs...)
}

// Records are what the xTR registers: each EID prefix behind every RLOC
// (addrs[i] is RLOCs[i]'s locator), so a gateway opens one subflow per path.
func (c *Config) Records(addrs []netip.Addr) []lisp.Record {
	var out []lisp.Record
	for _, p := range c.EIDPrefixes {
		r := lisp.Record{EID: p, TTL: c.TTL, Authoritative: true}
		for i, rl := range c.RLOCs {
			r.Locators = append(r.Locators, lisp.Locator{Addr: addrs[i], Priority: rl.Priority, Weight: rl.Weight,
				MPriority: 255, Local: true, Reachable: true})
		}
		out = append(out, r)
	}
	return out
}
