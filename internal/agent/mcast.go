package agent

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/internal/addrplan"
	"github.com/onehop/onehop/internal/datapath"
	"github.com/onehop/onehop/internal/ratelog"
)

// ScopeGroups is the sorted set of Ethernet multicast groups the uplink must
// take for these scopes (a node's compiled Entries.Scopes): one per scope
// with a local member, addrplan.ScopeMAC (03:00:0a:f:s:00 in the default
// plan), s = 0 for a farm. A subnet's group
// carries the fabric's ARP questions for its VMs and the subnet's
// broadcasts; a farm's, its farm-wide multicast (bpf/lib/broadcast.h).
func ScopeGroups(scopes map[datapath.ScopeKey]datapath.ScopeInfo) []net.HardwareAddr {
	out := make([]net.HardwareAddr, 0, len(scopes))
	for k, info := range scopes {
		if info.Count > 0 {
			out = append(out, addrplan.ScopeMAC(k.Farm, k.Subnet))
		}
	}
	sort.Slice(out, func(i, j int) bool { return bytes.Compare(out[i], out[j]) < 0 })
	return out
}

// isScopeGroup reports whether mac is a scope's group, 03:00:0a:*:*:00 (as
// is_scope_mac in bpf/lib/arp.h): onehop's by construction, so an agent
// adopts those a previous one joined and leaves no other group.
func isScopeGroup(mac net.HardwareAddr) bool {
	return len(mac) == 6 && mac[0] == 0x03 && mac[1] == 0 && mac[2] == 10 && mac[5] == 0
}

// groupDiff is what makes have into want: groups to join and to leave.
// Both lists are sorted; only scope groups are ever left.
func groupDiff(want, have []net.HardwareAddr) (join, leave []net.HardwareAddr) {
	in := func(l []net.HardwareAddr, m net.HardwareAddr) bool {
		for _, x := range l {
			if bytes.Equal(x, m) {
				return true
			}
		}
		return false
	}
	for _, m := range want {
		if !in(have, m) {
			join = append(join, m)
		}
	}
	for _, m := range have {
		if isScopeGroup(m) && !in(want, m) {
			leave = append(leave, m)
		}
	}
	return join, leave
}

// joinedGroups reads /proc/net/dev_mcast (r) for the scope groups ifname
// was joined to by SIOCADDMULTI: those with a global user ("ip maddr add",
// "static" in `ip maddr show`). Lines are "ifindex name users gusers
// address" (net/core/dev_addr_lists.c); a group someone holds only through
// a packet socket has no global user and is not ours. Sorted.
func joinedGroups(r io.Reader, ifname string) ([]net.HardwareAddr, error) {
	var out []net.HardwareAddr
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 5 || f[1] != ifname {
			continue
		}
		gusers, err := strconv.Atoi(f[3])
		if err != nil {
			return nil, fmt.Errorf("dev_mcast line %q: %w", sc.Text(), err)
		}
		mac, err := hex.DecodeString(f[4])
		if err != nil {
			return nil, fmt.Errorf("dev_mcast line %q: %w", sc.Text(), err)
		}
		if gusers > 0 && isScopeGroup(mac) {
			out = append(out, mac)
		}
	}
	sort.Slice(out, func(i, j int) bool { return bytes.Compare(out[i], out[j]) < 0 })
	return out, sc.Err()
}

// UplinkGroups keeps the uplink's Ethernet multicast list holding exactly
// the groups of the scopes with a local member, so a NIC that filters
// multicast passes the fabric's ARP questions and scoped broadcasts for
// them. It is level-triggered: every Sync reads the list back and mends it.
// Groups are left joined when the agent stops, like the pinned maps, so
// traffic keeps flowing across a restart; the next agent adopts them.
type UplinkGroups struct {
	uplink string
	log    *ratelog.Logger
	info   *slog.Logger

	mu                    sync.Mutex
	joined                int // scope groups on the uplink after the last Sync
	changes, failures     uint64
	groupsDesc, failsDesc *prometheus.Desc
	changesDesc           *prometheus.Desc
}

// NewUplinkGroups returns the reconciler of uplink's scope groups, in the
// network namespace of the thread that calls Sync.
func NewUplinkGroups(node, uplink string, log *slog.Logger) *UplinkGroups {
	l := prometheus.Labels{"node": node, "uplink": uplink}
	return &UplinkGroups{uplink: uplink, info: log, log: ratelog.New(log, 1, time.Minute, nil),
		groupsDesc: prometheus.NewDesc("onehop_uplink_multicast_groups",
			"Scope multicast groups (03:00:0a:f:s:00) the uplink is joined to.", nil, l),
		changesDesc: prometheus.NewDesc("onehop_uplink_multicast_changes_total",
			"Scope multicast groups joined or left on the uplink.", nil, l),
		failsDesc: prometheus.NewDesc("onehop_uplink_multicast_failures_total",
			"Reconciles of the uplink's multicast groups that failed (the agent log says why; retried every pass).", nil, l),
	}
}

// Sync joins the uplink to the groups of scopes and leaves the scope
// groups no local VM needs any more. A failure is logged (at most once a
// minute) and counted, never returned: the datapath is right without it,
// and the next pass tries again.
func (g *UplinkGroups) Sync(scopes map[datapath.ScopeKey]datapath.ScopeInfo) {
	joined, changed, err := g.sync(ScopeGroups(scopes))
	g.mu.Lock()
	g.joined = joined
	g.changes += uint64(changed)
	if err != nil {
		g.failures++
	}
	g.mu.Unlock()
	if err == nil {
		return
	}
	if ok, suppressed := g.log.Allow("uplink groups"); ok {
		g.info.Warn("uplink multicast groups not reconciled", "uplink", g.uplink, "err", err, "suppressed", suppressed)
	}
}

// sync returns how many scope groups the uplink holds afterwards and how
// many it joined or left.
func (g *UplinkGroups) sync(want []net.HardwareAddr) (joined, changed int, err error) {
	// thread-self: the namespace of the calling thread, which a test (or
	// a daemon entered into a host's namespace) may have switched.
	f, err := os.Open("/proc/thread-self/net/dev_mcast")
	if err != nil {
		return 0, 0, err
	}
	have, err := joinedGroups(f, g.uplink)
	f.Close()
	if err != nil {
		return 0, 0, err
	}
	join, leave := groupDiff(want, have)
	joined = len(have)
	if len(join)+len(leave) == 0 {
		return joined, 0, nil
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return joined, 0, fmt.Errorf("socket for SIOCADDMULTI: %w", err)
	}
	defer unix.Close(fd)
	for _, m := range leave {
		if err := multiIoctl(fd, unix.SIOCDELMULTI, g.uplink, m); err != nil {
			return joined, changed, fmt.Errorf("leave %s on %s: %w", m, g.uplink, err)
		}
		joined--
		changed++
	}
	for _, m := range join {
		if err := multiIoctl(fd, unix.SIOCADDMULTI, g.uplink, m); err != nil {
			return joined, changed, fmt.Errorf("join %s on %s: %w", m, g.uplink, err)
		}
		joined++
		changed++
	}
	g.info.Info("uplink multicast groups", "uplink", g.uplink, "joined", len(join), "left", len(leave), "groups", joined)
	return joined, changed, nil
}

// multiIoctl is SIOCADDMULTI/SIOCDELMULTI, what `ip maddr add|del` does: a
// "global" membership of the device (dev_mc_add_global), joined once
// however often it is added, and no socket's, so it outlives the agent.
func multiIoctl(fd int, req uint, ifname string, mac net.HardwareAddr) error {
	// struct ifreq: the name, then ifr_hwaddr, a struct sockaddr whose
	// family must be AF_UNSPEC (net/core/dev_ioctl.c).
	var ifr struct {
		name   [unix.IFNAMSIZ]byte
		family uint16
		data   [14]byte
		_      [8]byte
	}
	if len(ifname) >= unix.IFNAMSIZ {
		return fmt.Errorf("interface name %q too long", ifname)
	}
	copy(ifr.name[:], ifname)
	ifr.family = unix.AF_UNSPEC
	copy(ifr.data[:], mac)
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(req), uintptr(unsafe.Pointer(&ifr))); errno != 0 {
		return errno
	}
	return nil
}

// Describe implements prometheus.Collector.
func (g *UplinkGroups) Describe(ch chan<- *prometheus.Desc) {
	ch <- g.groupsDesc
	ch <- g.changesDesc
	ch <- g.failsDesc
}

// Collect implements prometheus.Collector.
func (g *UplinkGroups) Collect(ch chan<- prometheus.Metric) {
	g.mu.Lock()
	defer g.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(g.groupsDesc, prometheus.GaugeValue, float64(g.joined))
	ch <- prometheus.MustNewConstMetric(g.changesDesc, prometheus.CounterValue, float64(g.changes))
	ch <- prometheus.MustNewConstMetric(g.failsDesc, prometheus.CounterValue, float64(g.failures))
}
