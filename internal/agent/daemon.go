package agent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/internal/arpengine"
	"github.com/onehop/onehop/internal/backoff"
	"github.com/onehop/onehop/internal/datapath"
	desiredkeys "github.com/onehop/onehop/internal/desired"
	"github.com/onehop/onehop/internal/feature"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/opsport"
	"github.com/onehop/onehop/internal/pki"
	"github.com/onehop/onehop/internal/ratelog"
	"github.com/onehop/onehop/internal/sdnotify"
	"github.com/onehop/onehop/internal/store"
)

// DaemonConfig is the `onehop agent` command's configuration.
type DaemonConfig struct {
	Config
	EtcdEndpoints []string
	BPFFS         string // a mounted bpffs; the agent pins under BPFFS/NODE
	MetricsAddr   string
	DNS           []netip.Addr // handed to VMs by DHCP; none if empty
	// MappingTableSize fixes the mapping table's entries; 0 keeps the default.
	MappingTableSize int
	Sizes            datapath.Sizes // the other sized tables (datapath.SizeSpecs); 0 keeps a default
	// ARP tunes the ARP engine (refresh, idle, wait...); host fields are
	// filled in from the uplink.
	ARP arpengine.Config
	// TLS names the CA that signed etcd's certificate and this agent's own
	// client certificate (CN = the node name) and key.
	TLS pki.Files
	// Insecure dials etcd over plain TCP, with no certificate.
	Insecure bool
}

// Validate reports the first configuration mistake.
func (c DaemonConfig) Validate() error {
	switch {
	case c.Node == "":
		return errors.New("--node is required: the host name as in the topology")
	case len(c.EtcdEndpoints) == 0:
		return errors.New("--etcd-endpoints is required")
	case c.BPFFS == "":
		return errors.New("--bpffs is required: a directory for pinned maps and links")
	}
	if c.MetricsAddr != "" {
		if err := CheckMetricsAddr(c.MetricsAddr, nil); err != nil {
			return err
		}
	}
	if err := c.TLS.CheckMode(c.Insecure, "the agent dials etcd"); err != nil {
		return err
	}
	for _, e := range c.EtcdEndpoints {
		if err := pki.CheckURL("--etcd-endpoints", e, c.Insecure); err != nil {
			return err
		}
	}
	return nil
}

// RunDaemon runs the agent until ctx ends. Pinned maps and links outlive it:
// stopping the agent does not stop traffic.
func RunDaemon(ctx context.Context, cfg DaemonConfig, mount func(string) error, log *slog.Logger) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	var etcdTLS *tls.Config
	if !cfg.Insecure {
		var err error
		if etcdTLS, err = cfg.TLS.ClientConfig(); err != nil {
			return fmt.Errorf("--tls-*: %w", err)
		}
		// etcd takes the certificate's common name for the agent's user,
		// which may write only that host's records.
		cn, err := cfg.TLS.CommonName()
		if err != nil {
			return fmt.Errorf("--tls-cert: %w", err)
		}
		if cn != cfg.Node {
			return fmt.Errorf("--tls-cert %s is for %q, not for --node %s: etcd would refuse every write of %s's records (onehop pki issue agent %s makes its certificate)", cfg.TLS.Cert, cn, cfg.Node, cfg.Node, cfg.Node)
		}
	}
	if cfg.LocationServer.IsValid() {
		// The location server takes a relay only over TLS with this
		// agent's certificate (a sliver shares the host's address).
		if etcdTLS == nil {
			log.Warn("--insecure: no VNAT location relay (the location server takes relays only from an agent's certificate); VMs' daemons find their peers at their old places only")
		}
		cfg.LocationTLS = etcdTLS
	}
	if err := mount(cfg.BPFFS); err != nil {
		return err
	}
	s, err := store.DialEtcdTLS(cfg.EtcdEndpoints, etcdTLS)
	if err != nil {
		return err
	}
	defer s.Close()
	// The datapath's programs are built for the cloud's address plan:
	// read it before they are loaded.
	if err := usePlan(ctx, s, log); err != nil {
		return err
	}
	k, err := datapath.Open(filepath.Join(cfg.BPFFS, cfg.Node), datapath.Options{MappingTableSize: cfg.MappingTableSize, Sizes: cfg.Sizes})
	if err != nil {
		return err
	}
	defer k.Close()
	upIndex, upMAC, upIP, err := waitForUplink(ctx, cfg.Uplink, log)
	if err != nil {
		return err
	}
	sock, err := OpenPacketSocket()
	if err != nil {
		return err
	}
	defer sock.Close()
	// On the way out: ctx cancelled first (deferred below), then the
	// features' work is waited for, then the socket and the maps it uses
	// are closed.
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	arpCfg := cfg.ARP
	arpCfg.HostMAC = upMAC
	arpCfg.HostIP, _ = netip.ParseAddr(upIP)
	engine, err := arpengine.New(arpCfg, k, func(f []byte) error { return sock.Send(upIndex, f) }, monotonic, log)
	if err != nil {
		return err
	}
	if cfg.Ephemeral == nil {
		cfg.Ephemeral = EphemeralRange
	}
	a, err := New(cfg.Config, s, k, LinkTable{}, log)
	if err != nil {
		return err
	}
	purger := NewMappingPurger(s, k, log)
	arpStats := func() intent.ARPStats {
		st := engine.Stats()
		st.Purged = purger.Purged()
		return st
	}
	a.SetHooks(Hooks{Arrived: engine.Announce, ARPStats: arpStats, Ready: readyNotifier(log), FloatingArrived: func(addr netip.Addr) {
		if err := sock.Send(upIndex, arpengine.Gratuitous(upMAC, addr)); err != nil {
			log.Warn("announce a floating address", "addr", addr, "err", err)
		}
	}, Departed: func(ip netip.Addr) {
		// Where it went is the ARP engine's to find out on the next packet.
		if err := k.ForgetMapping(ip); err != nil {
			log.Warn("forget the mapping of a VM that left", "vm", ip, "err", err)
		}
	}})
	dhcpd := &DHCPServer{DNS: cfg.DNS, Local: a.Local}
	claims := NewClaimChecker(s, k, monotonic, func(vm netip.Addr, host net.HardwareAddr) {
		if err := sock.Send(upIndex, arpengine.Request(host, upMAC, arpCfg.HostIP, vm)); err != nil {
			log.Warn("ask a host about a VM it claims", "vm", vm, "host", host, "err", err)
		}
	}, log)
	groups := NewUplinkGroups(cfg.Node, cfg.Uplink, log)
	obs := NewObserver(cfg.Node, k, log)
	for _, f := range a.Features() {
		if t, ok := f.(interface {
			Stats() ([]intent.TapStats, error)
		}); ok {
			obs.WithTap(t.Stats)
		}
	}
	engine.Observe(obs.ARP)
	wg.Add(1)
	go func() { defer wg.Done(); obs.Run(ctx, s) }()
	a.Router().SetWork(&RouterWork{Kernel: k, Engine: engine, Claims: claims, Purger: purger, Log: log, Groups: groups, Observer: obs,
		SlowPath: &SlowPath{Sock: sock, DHCP: dhcpd, ARP: engine, Claims: claims, Shares: a.Shares(),
			Log: ratelog.New(log, 5, time.Second, nil)}})
	// Each feature's own work (the router's: the ARP engine, the drop log,
	// the slow path) runs beside the reconcile loop.
	for _, f := range a.Features() {
		r, ok := f.(feature.Runner)
		if !ok {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := r.Run(ctx); err != nil {
				log.Error("feature stopped", "feature", f.Name(), "err", err)
				cancel()
			}
		}()
	}

	if cfg.MetricsAddr != "" {
		if err := CheckMetricsAddr(cfg.MetricsAddr, uplinkAddrs(cfg.uplinks())); err != nil {
			return err
		}
		reg := prometheus.NewRegistry()
		reg.MustRegister(NewCollector(a), groups, a.listeners)
		ln, err := opsport.Listen("--metrics-addr", cfg.MetricsAddr)
		if err != nil {
			return err
		}
		opsport.Serve(ctx, ln, opsport.Config{Daemon: "agent", Gatherer: reg, Ready: a.Ready, Stats: a.listeners, Log: log})
	}
	defer sdnotify.Tell(log, sdnotify.Stopping)
	return a.Run(ctx)
}

// DefaultMetricsAddr is where the agent serves /metrics unless told
// otherwise: the host's loopback, which no guest reaches (CheckMetricsAddr).
const DefaultMetricsAddr = "127.0.0.1:9100"

// CheckMetricsAddr refuses a --metrics-addr a guest could reach. The
// counters name every VM and sliver of the host, and a sliver shares its
// host's uplink address and reaches the host's own stack on every port it
// does not lease (the hairpin): so neither every address (0.0.0.0, ::, an
// empty host) nor an address of an uplink (uplinks, as far as known) will
// do. The loopback, or a management address no guest shares, will.
func CheckMetricsAddr(addr string, uplinks []netip.Addr) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--metrics-addr %q: want IP:PORT (%s by default): %w", addr, DefaultMetricsAddr, err)
	}
	why := "slivers share this host's uplink address and reach its own stack through the hairpin, and the counters name every guest"
	if host == "" {
		return fmt.Errorf("--metrics-addr %q listens on every address, the uplink's too: %s; give the loopback (%s) or a management address no guest shares", addr, why, DefaultMetricsAddr)
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return fmt.Errorf("--metrics-addr %q: %q is not an IP address (a name could resolve to one a guest reaches)", addr, host)
	}
	if ip.IsUnspecified() {
		return fmt.Errorf("--metrics-addr %q listens on every address, the uplink's too: %s; give the loopback (%s) or a management address no guest shares", addr, why, DefaultMetricsAddr)
	}
	for _, u := range uplinks {
		if u == ip.Unmap() {
			return fmt.Errorf("--metrics-addr %q is an uplink's address: %s; give the loopback (%s) or a management address no guest shares", addr, why, DefaultMetricsAddr)
		}
	}
	return nil
}

// uplinkAddrs lists the addresses on the uplinks there are; one missing
// has none to refuse yet.
func uplinkAddrs(names []string) []netip.Addr {
	var out []netip.Addr
	for _, name := range names {
		l, err := netlink.LinkByName(name)
		if err != nil {
			continue
		}
		addrs, err := netlink.AddrList(l, netlink.FAMILY_ALL)
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if ip, ok := netip.AddrFromSlice(a.IP); ok {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out
}

// readyNotifier tells systemd the agent is ready: called after the first
// pass that attached and reconciled everything desired (Hooks.Ready).
func readyNotifier(log *slog.Logger) func() {
	return func() { sdnotify.Tell(log, sdnotify.Ready, sdnotify.Status("attached and reconciled")) }
}

// EphemeralRange reads this network namespace's net.ipv4.ip_local_port_range.
func EphemeralRange() (lo, hi uint16, err error) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0, 0, err
	}
	return ParsePortRange(string(b))
}

// ParsePortRange parses ip_local_port_range's "LO<whitespace>HI".
func ParsePortRange(s string) (lo, hi uint16, err error) {
	f := strings.Fields(s)
	if len(f) != 2 {
		return 0, 0, fmt.Errorf("port range %q: want two numbers", strings.TrimSpace(s))
	}
	l, err1 := strconv.ParseUint(f[0], 10, 16)
	h, err2 := strconv.ParseUint(f[1], 10, 16)
	if err1 != nil || err2 != nil || l == 0 || l > h {
		return 0, 0, fmt.Errorf("port range %q: want 1 <= lo <= hi <= 65535", strings.TrimSpace(s))
	}
	return uint16(l), uint16(h), nil
}

// waitForUplink returns the uplink's ifindex, MAC and IPv4 once it exists.
func waitForUplink(ctx context.Context, name string, log *slog.Logger) (int, net.HardwareAddr, string, error) {
	for warned := false; ; warned = true {
		idx, mac, ip, err := LinkTable{}.ByName(name)
		if err == nil && len(mac) == 6 {
			return idx, mac, ip, nil
		}
		if !warned {
			log.Warn("waiting for the uplink to appear", "uplink", name, "err", err)
		}
		select {
		case <-ctx.Done():
			return 0, nil, "", ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// runARPEngine drives the engine's timers: retries several times per wait,
// a table sweep every second.
func runARPEngine(ctx context.Context, e *arpengine.Engine, log *slog.Logger) {
	retry := time.NewTicker(50 * time.Millisecond)
	defer retry.Stop()
	sweep := time.NewTicker(time.Second)
	defer sweep.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-retry.C:
			e.Retry()
		case <-sweep.C:
			if err := e.Sweep(); err != nil {
				log.Warn("ARP engine sweep", "err", err)
			}
		}
	}
}

// monotonic reads CLOCK_MONOTONIC, the clock bpf_ktime_get_ns and (a tick
// behind) bpf_ktime_get_coarse_ns read.
func monotonic() time.Duration {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts) // cannot fail for this clock
	return time.Duration(ts.Nano())
}

func ifname(ifindex int) string {
	if l, err := netlink.LinkByIndex(ifindex); err == nil {
		return l.Attrs().Name
	}
	return fmt.Sprintf("ifindex %d", ifindex)
}

// LinkTable looks interfaces up in the agent's own namespace.
type LinkTable struct{}

// LinkKind implements LinkKinds: a tun device is "tap" in tap mode
// (IFLA_TUN_TYPE), "tun" otherwise.
func (LinkTable) LinkKind(name string) (string, error) {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return "", fmt.Errorf("interface %s: %w", name, err)
	}
	if t, ok := l.(*netlink.Tuntap); ok {
		if t.Mode == netlink.TUNTAP_MODE_TAP {
			return "tap", nil
		}
		return "tun", nil
	}
	return l.Type(), nil
}

// Neighbor implements Neighbors: a usable entry of the neighbour table,
// or else the kernel is asked to resolve ip (NTF_USE, as `ip neigh
// replace IP dev DEV use`) and the next reconcile looks again.
func (LinkTable) Neighbor(ifindex int, ip netip.Addr) (net.HardwareAddr, error) {
	ns, err := netlink.NeighList(ifindex, netlink.FAMILY_V4)
	if err != nil {
		return nil, fmt.Errorf("neighbours of %s: %w", ifname(ifindex), err)
	}
	usable := netlink.NUD_REACHABLE | netlink.NUD_STALE | netlink.NUD_DELAY | netlink.NUD_PROBE | netlink.NUD_PERMANENT | netlink.NUD_NOARP
	for _, n := range ns {
		if a, ok := netip.AddrFromSlice(n.IP); ok && a.Unmap() == ip && n.State&usable != 0 && len(n.HardwareAddr) == 6 {
			return n.HardwareAddr, nil
		}
	}
	if err := netlink.NeighSet(&netlink.Neigh{LinkIndex: ifindex, Family: netlink.FAMILY_V4, IP: ip.AsSlice(), Flags: netlink.NTF_USE}); err != nil {
		return nil, fmt.Errorf("resolve %s on %s: %w", ip, ifname(ifindex), err)
	}
	return nil, fmt.Errorf("%s not resolved on %s yet (asked)", ip, ifname(ifindex))
}

// PrefixBits implements PrefixBits.
func (LinkTable) PrefixBits(name, ip string) (int, error) {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return 0, fmt.Errorf("interface %s: %w", name, err)
	}
	addrs, err := netlink.AddrList(l, netlink.FAMILY_V4)
	if err != nil {
		return 0, fmt.Errorf("addresses of %s: %w", name, err)
	}
	for _, a := range addrs {
		if a.IP.String() == ip {
			bits, _ := a.Mask.Size()
			return bits, nil
		}
	}
	return 0, fmt.Errorf("interface %s has no address %s", name, ip)
}

// ByName implements Interfaces.
func (LinkTable) ByName(name string) (int, net.HardwareAddr, string, error) {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return 0, nil, "", fmt.Errorf("interface %s: %w", name, err)
	}
	ip := ""
	if addrs, err := netlink.AddrList(l, netlink.FAMILY_V4); err == nil && len(addrs) > 0 {
		ip = addrs[0].IP.String()
	}
	return l.Attrs().Index, l.Attrs().HardwareAddr, ip, nil
}

// usePlan reads the cloud's address plan and makes it this process's,
// trying again while the store does not answer yet (an agent may start
// before its controller).
func usePlan(ctx context.Context, s store.Store, log *slog.Logger) error {
	retry := backoff.Backoff{Initial: 200 * time.Millisecond, Max: 5 * time.Second}.Start(time.Now())
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		p, err := desiredkeys.UsePlan(cctx, s)
		cancel()
		if err == nil {
			log.Info("address plan", "plan", p.String())
			return nil
		}
		wait, _ := retry.Next(time.Now())
		log.Warn("reading the address plan; trying again", "err", err, "in", wait)
		if !backoff.Sleep(ctx, wait) {
			return fmt.Errorf("read the address plan: %w", err)
		}
	}
}
