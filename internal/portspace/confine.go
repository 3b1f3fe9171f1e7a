package portspace

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/internal/netns"
)

// The sliver's own routing: rules in this priority band are the
// confiner's, and the table for uplink k is hairpinTable+k.
const (
	rulePrefLease   = 100  // own leases to the shared address: deliver here
	rulePrefHairpin = 110  // the rest to the shared address: out to the host
	rulePrefSource  = 120  // sent from uplink k's address: out through eth<k>
	rulePrefLocal   = 1000 // where the kernel's "lookup local" (pref 0) moves
	hairpinTable    = 200
	sourceTable     = 210
)

// Confiner keeps each sliver's namespace configured for its lease: its
// ephemeral ports come from its lease, and a packet it sends to its own
// (shared) address on a port it does not lease leaves through its link, so
// the host's datapath steers it to the host or to the sliver that leases
// the port (hairpin, issue 8 item 7). When a lease shrinks it cuts the
// sliver's connections on the ports it lost.
//
// A sliver's namespace is found through its link: the peer of the host-side
// end, matched against the named namespaces in /run/netns.
type Confiner struct {
	log *slog.Logger
	// run runs a command; tests replace it to see what would be cut.
	run func(name string, args ...string) ([]byte, error)

	mu      sync.Mutex
	applied map[string]confinement // by sliver name
	cut     map[string]uint64      // connections cut, by sliver name
}

// confinement is what was last applied for one sliver.
type confinement struct {
	leases []Lease
	key    string
}

// NewConfiner returns a confiner logging to log.
func NewConfiner(log *slog.Logger) *Confiner {
	return &Confiner{log: log, applied: map[string]confinement{}, cut: map[string]uint64{},
		run: func(name string, args ...string) ([]byte, error) {
			return exec.Command(name, args...).CombinedOutput()
		}}
}

// Cut returns how many connections of each sliver were cut because their
// ports left its lease.
func (c *Confiner) Cut() map[string]uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]uint64, len(c.cut))
	for k, v := range c.cut {
		out[k] = v
	}
	return out
}

// Apply confines every sliver of p whose configuration changed since the
// last call, and forgets slivers no longer in p. One sliver's failure does
// not stop the others'; the errors are joined.
func (c *Confiner) Apply(p Plan) error {
	uplinks := map[int]Uplink{}
	for _, u := range p.Uplinks {
		uplinks[u.Index] = u
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	seen := map[string]bool{}
	for _, s := range p.Slivers {
		seen[s.Name] = true
		key := confinementKey(s, uplinks)
		old, had := c.applied[s.Name]
		if had && old.key == key {
			continue
		}
		ns, err := c.confine(s, uplinks)
		if err != nil {
			errs = append(errs, fmt.Errorf("sliver %s: %w", s.Name, err))
			continue
		}
		if had {
			c.cutLost(s.Name, ns, old.leases, s.Leases)
		}
		c.applied[s.Name] = confinement{leases: s.Leases, key: key}
	}
	for name := range c.applied {
		if !seen[name] {
			delete(c.applied, name)
			delete(c.cut, name)
		}
	}
	return errors.Join(errs...)
}

func confinementKey(s Sliver, uplinks map[int]Uplink) string {
	var b strings.Builder
	for _, v := range s.Vifs {
		u := uplinks[v.Uplink]
		fmt.Fprintf(&b, "v%d:%s:%d:%s:%s;", v.Uplink, v.Name, v.Ifindex, u.Addr, u.MAC)
	}
	for _, l := range s.Leases {
		fmt.Fprintf(&b, "l%d:%d-%d;", l.Uplink, l.Lo, l.Hi)
	}
	return b.String()
}

// confine configures the host-side ends of s's links and s's namespace,
// and returns the namespace's name.
func (c *Confiner) confine(s Sliver, uplinks map[int]Uplink) (string, error) {
	if len(s.Vifs) == 0 {
		return "", errors.New("no link to confine")
	}
	ns := ""
	for _, v := range s.Vifs {
		// The host's stack takes hairpin packets from the sliver, whose
		// source is the host's own address: Linux calls that a martian
		// unless the link accepts local sources.
		for key, val := range map[string]string{"accept_local": "1", "rp_filter": "0"} {
			if err := writeSysctl(filepath.Join("net/ipv4/conf", v.Name, key), val); err != nil {
				return "", err
			}
		}
		// The sliver addresses the host with the MAC they share: the host's
		// end must own it too, or its stack ignores the hairpin frames it
		// is handed (PACKET_OTHERHOST).
		if err := ownMAC(v, uplinks[v.Uplink].MAC); err != nil {
			return "", err
		}
		found, err := peerNetns(v.Ifindex)
		if err != nil {
			return "", fmt.Errorf("link %s: %w", v.Name, err)
		}
		if ns != "" && found != ns {
			return "", fmt.Errorf("links %s and %s lead to different namespaces (%s, %s)", s.Vifs[0].Name, v.Name, ns, found)
		}
		ns = found
	}
	lo, hi := EphemeralOf(s.Leases)
	err := netns.Do(ns, func() error {
		if err := writeSysctl("net/ipv4/ip_local_port_range", fmt.Sprintf("%d %d", lo, hi)); err != nil {
			return err
		}
		for _, v := range s.Vifs {
			dev := "eth" + strconv.Itoa(v.Uplink)
			for key, val := range map[string]string{"accept_local": "1", "rp_filter": "0"} {
				if err := writeSysctl(filepath.Join("net/ipv4/conf", dev, key), val); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	h, err := netns.Handle(ns)
	if err != nil {
		return "", err
	}
	defer h.Close()
	if err := hairpinRoutes(h, s, uplinks); err != nil {
		return "", fmt.Errorf("namespace %s: %w", ns, err)
	}
	c.log.Info("sliver confined to its lease", "sliver", s.Name, "netns", ns,
		"ephemeral", fmt.Sprintf("%d-%d", lo, hi), "leases", leaseText(s.Leases))
	return ns, nil
}

// EphemeralOf is the range a sliver's kernel picks its own ports from: its
// first lease (by uplink, then port), since Linux takes one range per
// namespace.
func EphemeralOf(leases []Lease) (lo, hi uint16) {
	ls := append([]Lease(nil), leases...)
	sort.Slice(ls, func(i, j int) bool {
		if ls[i].Uplink != ls[j].Uplink {
			return ls[i].Uplink < ls[j].Uplink
		}
		return ls[i].Lo < ls[j].Lo
	})
	if len(ls) == 0 {
		return 0, 0
	}
	return ls[0].Lo, ls[0].Hi
}

// hairpinRoutes makes the sliver send what it addresses to its own (shared)
// address out through its link, except on the ports it leases: those stay
// its own. Only locally generated packets ("iif lo") are concerned: what
// arrives from the host is delivered as usual.
func hairpinRoutes(h *netlink.Handle, s Sliver, uplinks map[int]Uplink) error {
	rules, err := h.RuleList(netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("list rules: %w", err)
	}
	localAt := map[int]bool{}
	for _, r := range rules {
		if r.Table == unix.RT_TABLE_LOCAL && r.Src == nil && r.Dst == nil && r.IifName == "" {
			localAt[r.Priority] = true
		}
		if r.Priority >= rulePrefLease && r.Priority < rulePrefLocal {
			r := r
			if err := h.RuleDel(&r); err != nil {
				return fmt.Errorf("remove old rule %s: %w", r, err)
			}
		}
	}
	if !localAt[rulePrefLocal] {
		r := netlink.NewRule()
		r.Priority, r.Table, r.Family = rulePrefLocal, unix.RT_TABLE_LOCAL, netlink.FAMILY_V4
		if err := h.RuleAdd(r); err != nil {
			return fmt.Errorf("add rule %d lookup local: %w", rulePrefLocal, err)
		}
	}
	if localAt[0] {
		r := netlink.NewRule()
		r.Priority, r.Table, r.Family = 0, unix.RT_TABLE_LOCAL, netlink.FAMILY_V4
		if err := h.RuleDel(r); err != nil {
			return fmt.Errorf("move rule 0 lookup local: %w", err)
		}
	}
	for _, v := range s.Vifs {
		u, ok := uplinks[v.Uplink]
		if !ok || !u.Addr.IsValid() {
			return fmt.Errorf("uplink %d has no address", v.Uplink)
		}
		dev := "eth" + strconv.Itoa(v.Uplink)
		link, err := h.LinkByName(dev)
		if err != nil {
			return fmt.Errorf("link %s: %w", dev, err)
		}
		self := &net.IPNet{IP: u.Addr.AsSlice(), Mask: net.CIDRMask(32, 32)}
		for _, l := range s.Leases {
			if l.Uplink != v.Uplink {
				continue
			}
			for _, proto := range []int{unix.IPPROTO_TCP, unix.IPPROTO_UDP} {
				r := netlink.NewRule()
				r.Priority, r.Table, r.Family = rulePrefLease, unix.RT_TABLE_LOCAL, netlink.FAMILY_V4
				r.IifName, r.Dst, r.IPProto = "lo", self, proto
				r.Dport = netlink.NewRulePortRange(l.Lo, l.Hi)
				if err := h.RuleAdd(r); err != nil {
					return fmt.Errorf("add rule for lease %d-%d: %w", l.Lo, l.Hi, err)
				}
			}
		}
		table := hairpinTable + v.Uplink
		r := netlink.NewRule()
		r.Priority, r.Table, r.Family = rulePrefHairpin, table, netlink.FAMILY_V4
		r.IifName, r.Dst = "lo", self
		if err := h.RuleAdd(r); err != nil {
			return fmt.Errorf("add hairpin rule: %w", err)
		}
		route := &netlink.Route{LinkIndex: link.Attrs().Index, Dst: self, Table: table, Scope: netlink.SCOPE_LINK}
		if err := h.RouteReplace(route); err != nil {
			return fmt.Errorf("hairpin route via %s: %w", dev, err)
		}
		// A multi-homed sliver's packets from uplink k's address leave
		// through eth<k>, whatever the main table's first route says: the
		// host's program on that link takes only that uplink's address and
		// MAC (and an ARP from eth0 asking with eth1's address is forged).
		addrs, err := h.AddrList(link, netlink.FAMILY_V4)
		if err != nil {
			return fmt.Errorf("addresses of %s: %w", dev, err)
		}
		for _, a := range addrs {
			subnet := &net.IPNet{IP: a.IP.Mask(a.Mask), Mask: a.Mask}
			route := &netlink.Route{LinkIndex: link.Attrs().Index, Dst: subnet, Src: a.IP, Table: sourceTable + v.Uplink, Scope: netlink.SCOPE_LINK}
			if err := h.RouteReplace(route); err != nil {
				return fmt.Errorf("route for %s's own subnet %s: %w", dev, subnet, err)
			}
		}
		fromSelf := netlink.NewRule()
		fromSelf.Priority, fromSelf.Table, fromSelf.Family = rulePrefSource, sourceTable+v.Uplink, netlink.FAMILY_V4
		fromSelf.IifName, fromSelf.Src = "lo", self
		if err := h.RuleAdd(fromSelf); err != nil {
			return fmt.Errorf("add source rule for %s: %w", dev, err)
		}
		// The address is the sliver's own: it must never ARP for it.
		neigh := &netlink.Neigh{LinkIndex: link.Attrs().Index, Family: netlink.FAMILY_V4,
			State: netlink.NUD_PERMANENT, IP: u.Addr.AsSlice(), HardwareAddr: u.MAC}
		if err := h.NeighSet(neigh); err != nil {
			return fmt.Errorf("neighbour %s on %s: %w", u.Addr, dev, err)
		}
	}
	return nil
}

// cutLost destroys the sliver's sockets on ports it no longer leases: their
// packets would be dropped from now on anyway, and an application is better
// told at once (a reset) than left to time out.
func (c *Confiner) cutLost(sliver, ns string, old, now []Lease) {
	for _, l := range LostPorts(old, now) {
		filter := fmt.Sprintf("( sport >= :%d and sport <= :%d )", l.Lo, l.Hi)
		out, err := c.run("nsenter", "--net="+netns.Path(ns), "ss", "-K", "-tuanH", filter)
		if err != nil {
			c.log.Warn("cutting a sliver's connections on ports it lost", "sliver", sliver, "ports", leaseText([]Lease{l}), "err", err, "output", strings.TrimSpace(string(out)))
			continue
		}
		n := uint64(bytes.Count(bytes.TrimSpace(out), []byte("\n")))
		if len(bytes.TrimSpace(out)) > 0 {
			n++
		}
		c.cut[sliver] += n
		c.log.Warn("lease shrank: cut the sliver's connections on the ports it lost", "sliver", sliver,
			"ports", leaseText([]Lease{l}), "connections", n)
	}
}

// LostPorts lists the ranges of old that now does not cover, per uplink.
func LostPorts(old, now []Lease) []Lease {
	var lost []Lease
	for _, o := range old {
		// Walk o's ports, skipping what some lease in now covers.
		next := uint32(o.Lo)
		for next <= uint32(o.Hi) {
			covered := false
			for _, n := range now {
				if n.Uplink == o.Uplink && uint32(n.Lo) <= next && next <= uint32(n.Hi) {
					next = uint32(n.Hi) + 1
					covered = true
					break
				}
			}
			if covered {
				continue
			}
			end := uint32(o.Hi)
			for _, n := range now {
				if n.Uplink == o.Uplink && uint32(n.Lo) > next && uint32(n.Lo)-1 < end {
					end = uint32(n.Lo) - 1
				}
			}
			lost = append(lost, Lease{Uplink: o.Uplink, Lo: uint16(next), Hi: uint16(end)})
			next = end + 1
		}
	}
	return lost
}

func ownMAC(v Vif, mac net.HardwareAddr) error {
	if len(mac) == 0 {
		return fmt.Errorf("uplink %d has no MAC", v.Uplink)
	}
	l, err := netlink.LinkByIndex(v.Ifindex)
	if err != nil {
		return fmt.Errorf("link %s: %w", v.Name, err)
	}
	if bytes.Equal(l.Attrs().HardwareAddr, mac) {
		return nil
	}
	if err := netlink.LinkSetHardwareAddr(l, mac); err != nil {
		return fmt.Errorf("give %s the shared MAC %s: %w", v.Name, mac, err)
	}
	return nil
}

// peerNetns names the namespace (in /run/netns) holding the other end of
// the veth ifindex.
func peerNetns(ifindex int) (string, error) {
	l, err := netlink.LinkByIndex(ifindex)
	if err != nil {
		return "", err
	}
	id := l.Attrs().NetNsID
	if id < 0 {
		return "", errors.New("its peer is in this namespace, not a sliver's")
	}
	names, err := netns.List("")
	if err != nil {
		return "", err
	}
	for _, name := range names {
		fd, err := unix.Open(netns.Path(name), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		got, err := netlink.GetNetNsIdByFd(fd)
		unix.Close(fd)
		if err == nil && got == id {
			return name, nil
		}
	}
	return "", fmt.Errorf("its peer's namespace (nsid %d) is not named in %s", id, netns.Dir)
}

// writeSysctl writes a sysctl of the calling thread's network namespace.
func writeSysctl(key, value string) error {
	if err := os.WriteFile(filepath.Join("/proc/sys", key), []byte(value), 0o644); err != nil {
		return fmt.Errorf("sysctl %s=%s: %w", key, value, err)
	}
	return nil
}

// leaseText writes leases for logs: "[UPLINK:]LO-HI,...".
func leaseText(ls []Lease) string {
	parts := make([]string, len(ls))
	for i, l := range ls {
		parts[i] = fmt.Sprintf("%d-%d", l.Lo, l.Hi)
		if l.Uplink != 0 {
			parts[i] = strconv.Itoa(l.Uplink) + ":" + parts[i]
		}
	}
	return strings.Join(parts, ",")
}
