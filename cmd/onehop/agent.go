package main

import (
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/onehop/onehop/internal/agent"
	"github.com/onehop/onehop/internal/arpengine"
	"github.com/onehop/onehop/internal/datapath"
	"github.com/onehop/onehop/internal/lab"
	"github.com/onehop/onehop/internal/limits"
)

func agentCmd() *cobra.Command {
	var cfg agent.DaemonConfig
	var endpoints, dns, locServer string
	var uplinks []string
	var logs *logFlags
	c := &cobra.Command{
		Use:   "agent",
		Short: "Run the per-host agent: keeps this host's eBPF datapath equal to its desired state",
		Long: `The agent runs in the host's network namespace. It loads the datapath, attaches
it (tcx ingress) to the uplink and to every local VM's vif, reports the uplink's
MAC to etcd, and reconciles the BPF maps to the host's desired state whenever it
changes and every --resync. Maps and links are pinned under --bpffs/NODE, so
stopping or restarting the agent does not interrupt traffic.

Where other hosts' VMs live is not pushed to it: its ARP engine learns that on
demand into a fixed-size LRU mapping table (--mapping-table-size). A packet for
an address not in the table waits in the agent while the engine asks the last
known host, then the farm/subnet's Ethernet multicast address; entries in use
are confirmed every --arp-refresh and forgotten after --arp-idle unused.

Metrics (per-reason drop counters, forwarded packets, mapping-table use, ARP
engine events) are served in Prometheus format on --metrics-addr/metrics, the
host's loopback by default: they count every guest's traffic, so no guest may
reach them (docs/security.md). Every drop is also logged with its reason
(rate-limited).`,
		Example: `  onehop agent --node h1 --etcd-endpoints http://192.168.100.1:2379 --uplink uplink0 --bpffs /run/onehop/bpffs`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg.EtcdEndpoints = splitList(endpoints)
			if err := setUplinks(&cfg.Config, uplinks); err != nil {
				return err
			}
			if cfg.MappingTableSize < datapath.MinMappingTableSize {
				return fmt.Errorf("--mapping-table-size %d: must be at least %d", cfg.MappingTableSize, datapath.MinMappingTableSize)
			}
			all := cfg.Sizes
			all.Mappings = cfg.MappingTableSize
			if err := all.Validate(); err != nil {
				return err
			}
			for flag, d := range map[string]time.Duration{"--arp-refresh": cfg.ARP.Refresh, "--arp-idle": cfg.ARP.Idle, "--arp-wait": cfg.ARP.Wait} {
				if d <= 0 {
					return fmt.Errorf("%s %v: must be positive", flag, d)
				}
			}
			for _, d := range splitList(dns) {
				a, err := netip.ParseAddr(d)
				if err != nil || !a.Is4() {
					return fmt.Errorf("--dns %q: not an IPv4 address", d)
				}
				cfg.DNS = append(cfg.DNS, a)
			}
			if locServer != "" {
				a, err := netip.ParseAddr(locServer)
				if err != nil || !a.Is4() {
					return fmt.Errorf("--location-server %q: not an IPv4 address", locServer)
				}
				cfg.LocationServer = a
			}
			ctx, cancel := signalContext()
			defer cancel()
			return agent.RunDaemon(ctx, cfg, lab.MountBPFFS, logs.logger())
		},
	}
	f := c.Flags()
	f.StringVar(&cfg.Node, "node", "", "this host's name, as in the intent")
	f.StringVar(&endpoints, "etcd-endpoints", "", "comma-separated etcd endpoints")
	f.StringSliceVar(&uplinks, "uplink", []string{"uplink0"},
		"the host's interface on the fabric; repeat for a multi-homed host (the first carries the VMs' traffic, slivers may lease ports on every one)")
	f.StringVar(&cfg.SliverCgroups, "sliver-cgroups", "",
		"cgroup v2 directory whose child NAME holds sliver NAME's processes: binds outside its lease fail there with EPERM")
	f.StringVar(&cfg.BPFFS, "bpffs", "/run/onehop/bpffs", "bpffs mount point (mounted if needed); keep it outside /sys")
	addMetricsAddrFlag(c, &cfg.MetricsAddr, agent.DefaultMetricsAddr,
		"never every address nor an uplink's (slivers share it): the loopback or a management address")
	f.DurationVar(&cfg.Resync, "resync", 2*time.Second, "reconcile at least this often")
	f.DurationVar(&cfg.StatusEvery, "status-interval", 0,
		fmt.Sprintf("write this host's status at most this often while changes keep coming; a quiet host reports its first change at once. 0: sized to the cloud, hosts/%d seconds between %v and %v, so all agents together write at most about %d a second up to %d hosts (docs/control-plane.md)",
			agent.StatusWritesPerSecond, agent.MinStatusEvery, agent.MaxStatusEvery, agent.StatusWritesPerSecond, int(agent.MaxStatusEvery/time.Second)*agent.StatusWritesPerSecond))
	f.StringVar(&locServer, "location-server", "", "the VNAT location server (the controller's fabric address): VMs' VNAT daemons reach it at 169.254.20.31:2031 through this host (docs/vnat-location.md)")
	f.StringVar(&dns, "dns", "", "comma-separated DNS servers handed to VMs by DHCP (none by default)")
	f.IntVar(&cfg.MappingTableSize, "mapping-table-size", 16384,
		"fixed number of remote VMs the mapping table holds (LRU beyond it; at least 64)")
	for _, sp := range datapath.SizeSpecs[1:] { // [0] is --mapping-table-size, above
		f.IntVar(sp.Field(&cfg.Sizes), strings.TrimPrefix(sp.Flag, "--"), sp.Default, fmt.Sprintf("%s, %d to %d (docs/sizing.md: memory per entry)", sp.What, sp.Min, sp.Max))
	}
	f.DurationVar(&cfg.ARP.Refresh, "arp-refresh", arpengine.DefaultRefresh,
		"confirm a mapping in use when it is older than this (unicast to its host first, then multicast)")
	f.DurationVar(&cfg.ARP.Idle, "arp-idle", arpengine.DefaultIdle, "forget a mapping unused for this long")
	f.DurationVar(&cfg.ARP.Wait, "arp-wait", arpengine.DefaultWait, "how long one ARP question waits for its answer")
	addAgentTLSFlags(c, &cfg)
	logs = addLogFlags(c)
	return c
}

// setUplinks takes the --uplink list: the first is the router's, the rest a
// multi-homed host's other links; names must be distinct interface names.
func setUplinks(cfg *agent.Config, names []string) error {
	if len(names) == 0 {
		return fmt.Errorf("--uplink: at least one interface is required")
	}
	if len(names) > limits.MaxUplinks {
		return fmt.Errorf("--uplink: %d given, at most %d uplinks per host", len(names), limits.MaxUplinks)
	}
	seen := map[string]bool{}
	for _, n := range names {
		if n == "" || len(n) > 15 || strings.ContainsAny(n, "/ \t") {
			return fmt.Errorf("--uplink %q: not an interface name (1-15 characters, no '/' or spaces)", n)
		}
		if seen[n] {
			return fmt.Errorf("--uplink %q: given twice", n)
		}
		seen[n] = true
	}
	cfg.Uplink, cfg.MoreUplinks = names[0], names[1:]
	return nil
}
