// Command onehop is the one binary of onehop: the controller, the per-host
// agent, the lab that emulates a data center on one machine, and the
// operator's verbs.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/onehop/onehop/internal/agent"
	"github.com/onehop/onehop/internal/arpengine"
	"github.com/onehop/onehop/internal/controller"
	"github.com/onehop/onehop/internal/datapath"
	"github.com/onehop/onehop/internal/lab"
	"github.com/onehop/onehop/internal/netns"
	"github.com/onehop/onehop/internal/topology"
)

func main() {
	if err := newRootCmd().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "onehop:", err)
		os.Exit(1)
	}
}

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "onehop",
		Short: "Host-based network virtualization: one-hop routing between VMs, in the kernel",
		Long: `onehop gives tenants their own networks on a shared L2 fabric. Every host runs
an agent that programs eBPF on each VM's vif and on the host's uplink; a packet
goes straight from the sender's host to the receiver's host, with no
encapsulation. The controller keeps intent and allocations in etcd.

Try it on one machine (as root):
  onehop lab up examples/quickstart.yaml   build hosts and VMs in namespaces
  onehop lab exec web1 -- ping 10.1.1.3     talk between VMs across hosts
  onehop lab status                         what is where
  onehop lab down                           remove all of it`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().StringVar(&apiAddr, "api", "", "controller REST API: a unix socket or https://HOST:PORT (default: the lab's socket)")
	addClientTLSFlags(root)
	root.AddCommand(labCmd(), controllerCmd(), agentCmd(), netnsExecCmd())
	root.AddCommand(verbCmds()...)
	return root
}

func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
}

func logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func controllerCmd() *cobra.Command {
	var cfg controller.DaemonConfig
	var endpoints string
	c := &cobra.Command{
		Use:   "controller",
		Short: "Run the controller: intent, address allocation, per-host desired state",
		Long: `The controller is the only writer of intent. It allocates every VM's 10.f.s.h
address and virtual MAC, and compiles intent plus the agents' node reports into
each host's desired state under /onehop/desired/HOST in etcd.

By default it runs etcd embedded (data in --data-dir, served on --client-url
for agents and on --socket for local tools). With --etcd-endpoints it uses an
external etcd cluster instead.`,
		Example: `  onehop controller --data-dir /var/lib/onehop/etcd --client-url http://192.168.100.1:2379 --topology lab.yaml
  onehop controller --etcd-endpoints http://10.0.0.5:2379,http://10.0.0.6:2379`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg.EtcdEndpoints = splitList(endpoints)
			ctx, cancel := signalContext()
			defer cancel()
			return controller.RunDaemon(ctx, cfg, logger())
		},
	}
	f := c.Flags()
	f.StringVar(&cfg.DataDir, "data-dir", "", "embedded etcd data directory")
	f.StringVar(&cfg.ClientURL, "client-url", "", "embedded etcd client URL, http://IP:PORT, reachable by agents")
	f.StringVar(&cfg.Socket, "socket", "", "unix socket the embedded etcd also serves (optional)")
	f.StringVar(&endpoints, "etcd-endpoints", "", "comma-separated external etcd endpoints; disables the embedded etcd")
	f.StringVar(&cfg.Topology, "topology", "", "topology file whose hosts, farms, subnets and VMs seed an empty store")
	f.StringVar(&cfg.APISocket, "api-socket", "", "unix socket to serve the REST API on")
	f.StringVar(&cfg.APIListen, "api-listen", "", "TCP address to serve the REST API on, e.g. 127.0.0.1:8080")
	addControllerTLSFlags(c, &cfg)
	return c
}

func agentCmd() *cobra.Command {
	var cfg agent.DaemonConfig
	var endpoints, dns string
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
engine events) are served in Prometheus format on --metrics-addr/metrics; every
drop is also logged with its reason (rate-limited).`,
		Example: `  onehop agent --node h1 --etcd-endpoints http://192.168.100.1:2379 --uplink uplink0 --bpffs /run/onehop/bpffs`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg.EtcdEndpoints = splitList(endpoints)
			if cfg.MappingTableSize < datapath.MinMappingTableSize {
				return fmt.Errorf("--mapping-table-size %d: must be at least %d", cfg.MappingTableSize, datapath.MinMappingTableSize)
			}
			for flag, d := range map[string]time.Duration{"--arp-refresh": cfg.ARP.Refresh, "--arp-idle": cfg.ARP.Idle, "--arp-wait": cfg.ARP.Wait} {
				if d <= 0 {
					return fmt.Errorf("%s %v: must be positive", flag, d)
				}
			}
			if cfg.MappingTableSize < datapath.MinMappingTableSize {
				return fmt.Errorf("--mapping-table-size %d: must be at least %d", cfg.MappingTableSize, datapath.MinMappingTableSize)
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
			ctx, cancel := signalContext()
			defer cancel()
			return agent.RunDaemon(ctx, cfg, lab.MountBPFFS, logger())
		},
	}
	f := c.Flags()
	f.StringVar(&cfg.Node, "node", "", "this host's name, as in the intent")
	f.StringVar(&endpoints, "etcd-endpoints", "", "comma-separated etcd endpoints")
	f.StringVar(&cfg.Uplink, "uplink", "uplink0", "the host's interface on the fabric")
	f.StringVar(&cfg.BPFFS, "bpffs", "/run/onehop/bpffs", "bpffs mount point (mounted if needed); keep it outside /sys")
	f.StringVar(&cfg.MetricsAddr, "metrics-addr", ":9100", "address for /metrics; empty to disable")
	f.DurationVar(&cfg.Resync, "resync", 2*time.Second, "reconcile at least this often")
	f.StringVar(&dns, "dns", "", "comma-separated DNS servers handed to VMs by DHCP (none by default)")
	f.IntVar(&cfg.MappingTableSize, "mapping-table-size", 16384,
		"fixed number of remote VMs the mapping table holds (LRU beyond it; at least 64)")
	f.DurationVar(&cfg.ARP.Refresh, "arp-refresh", arpengine.DefaultRefresh,
		"confirm a mapping in use when it is older than this (unicast to its host first, then multicast)")
	f.DurationVar(&cfg.ARP.Idle, "arp-idle", arpengine.DefaultIdle, "forget a mapping unused for this long")
	f.DurationVar(&cfg.ARP.Wait, "arp-wait", arpengine.DefaultWait, "how long one ARP question waits for its answer")
	addAgentTLSFlags(c, &cfg)
	return c
}

func netnsExecCmd() *cobra.Command {
	return &cobra.Command{
		Use:    "netns-exec NETNS -- COMMAND [ARG...]",
		Short:  "Run a command inside a named network namespace (used to start daemons)",
		Hidden: true,
		Args:   cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return netns.Exec(args[0], args[1:])
		},
	}
}

func labCmd() *cobra.Command {
	var root, name string
	c := &cobra.Command{
		Use:   "lab",
		Short: "Emulate a data center on this machine: hosts and VMs in network namespaces",
		Long: `A lab is built from a topology file: a fabric namespace with a Linux bridge (the
flat L2 underlay), one namespace per host with an uplink into it and an agent,
one namespace per VM behind a veth pair whose host end (vif-VM) lives in the
host's namespace, and the controller with its embedded etcd on the fabric.
Namespaces are named oh-LAB-NODE, so 'ip netns' and 'nsenter' work on them too.`,
	}
	c.PersistentFlags().StringVar(&root, "root", lab.DefaultRoot, "where labs keep their state")
	c.PersistentFlags().StringVar(&name, "lab", "", "which lab (default: the only one that is up)")

	var timeout time.Duration
	up := &cobra.Command{
		Use:   "up FILE",
		Short: "Build the lab a topology file describes and start its controller and agents",
		Long: `Validates FILE completely before creating anything (errors name the line),
builds the lab step by step, and returns once every agent has programmed its
datapath. If any step fails, everything made so far is removed again.`,
		Example: "  onehop lab up examples/quickstart.yaml",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			t, err := topology.Load(args[0])
			if err != nil {
				return err
			}
			ctx, cancel := signalContext()
			defer cancel()
			fmt.Fprintf(os.Stderr, "Building lab %q from %s (%d hosts, %d VMs, datapath %s):\n", t.Name, args[0], len(t.Hosts), len(t.VMs), t.Datapath)
			start := time.Now()
			st, err := lab.Up(ctx, t, lab.Options{Root: root, Progress: os.Stderr, Timeout: timeout})
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "Lab %q is up in %.1fs. Next: `onehop lab status`, `onehop lab exec NODE -- CMD`, `onehop lab down`.\n", st.Name, time.Since(start).Seconds())
			return nil
		},
	}
	up.Flags().DurationVar(&timeout, "timeout", 60*time.Second, "how long to wait for the controller and agents")

	down := &cobra.Command{
		Use:   "down",
		Short: "Remove everything the lab made: daemons, namespaces, links, pins, state",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			n, err := lab.Resolve(root, name)
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "Tearing down lab %q:\n", n)
			if err := lab.Down(root, n, os.Stderr); err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "Lab %q is down.\n", n)
			return nil
		},
	}

	var output string
	status := &cobra.Command{
		Use:   "status",
		Short: "Show every node of the lab: namespace, interfaces, MACs, IPs, daemons",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := loadLab(root, name)
			if err != nil {
				return err
			}
			r := lab.Status(cmd.Context(), st)
			switch output {
			case "json":
				enc := json.NewEncoder(os.Stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(r)
			case "text", "":
				printStatus(r)
				return nil
			}
			return fmt.Errorf("-o %q: want text or json", output)
		},
	}
	status.Flags().StringVarP(&output, "output", "o", "text", "text or json")

	exec := &cobra.Command{
		Use:   "exec NODE -- COMMAND [ARG...]",
		Short: "Run a command inside a node of the lab (a VM, a host, the fabric or the controller)",
		Example: `  onehop lab exec web1 -- ping -c 3 10.1.1.3
  onehop lab exec h1 -- curl -s localhost:9100/metrics
  onehop lab exec fabric -- tcpdump -eni br0`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			n, err := lab.Resolve(root, name)
			if err != nil {
				return err
			}
			ns := lab.NamespaceOf(n, args[0])
			if !netns.Exists(ns) {
				return fmt.Errorf("lab %q has no node %q (no namespace %s); `onehop lab status` lists them", n, args[0], ns)
			}
			return netns.Exec(ns, args[1:])
		},
	}
	restart := &cobra.Command{
		Use:   "restart NODE",
		Short: "Restart the daemon of a lab node (a host's agent, or the controller)",
		Long: `Stops the daemon (SIGTERM) and starts it again with the same arguments. Maps and
links are pinned, so traffic between VMs keeps flowing while an agent is down,
and the new agent takes the same maps over and reconciles them.`,
		Example: "  onehop lab restart h1",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := loadLab(root, name)
			if err != nil {
				return err
			}
			p, err := lab.Restart(st, args[0], "")
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "Restarted %s on %s (pid %d, log %s).\n", p.Name, args[0], p.PID, p.Log)
			return nil
		},
	}
	var to string
	move := &cobra.Command{
		Use:   "move VM --to HOST",
		Short: "Move a VM to another host (its address stays; its connections survive)",
		Long: `Tells the controller the VM now runs on HOST, then re-plumbs the VM's vif into
HOST's namespace, as a live migration would: the VM keeps its interface,
address and MAC, and every host's mapping table follows within a second.`,
		Example: "  onehop lab move web1 --to h2",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if to == "" {
				return fmt.Errorf("--to is required: the host to move %s to", args[0])
			}
			st, err := loadLab(root, name)
			if err != nil {
				return err
			}
			v, err := lab.Move(st, args[0], to)
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "Moved %s (%s) to %s.\n", v.FullName(), v.IP, v.Host)
			return nil
		},
	}
	move.Flags().StringVar(&to, "to", "", "the host to move the VM to")
	c.AddCommand(up, down, status, exec, restart, move)
	return c
}

func printStatus(r *lab.Report) {
	fmt.Printf("lab %s (%s, datapath %s) from %s\n\n", r.Name, r.Phase, r.Datapath, r.Topology)
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "NODE\tKIND\tNETNS\tINTERFACE\tMAC\tADDRESS\tSTATE")
	for _, n := range r.Nodes {
		state := "present"
		if !n.Present {
			state = "MISSING"
		}
		if n.Process != nil {
			if n.Process.Alive {
				state = fmt.Sprintf("%s pid %d", n.Process.Name, n.Process.PID)
			} else {
				state = fmt.Sprintf("%s NOT RUNNING (log %s)", n.Process.Name, n.Process.Log)
			}
		}
		if n.Agent != nil {
			state += fmt.Sprintf(", %d endpoints, vifs %v", n.Agent.Endpoints, n.Agent.AttachedVifs)
			if n.Agent.Error != "" {
				state += ", error: " + n.Agent.Error
			}
		}
		if len(n.Interfaces) == 0 {
			fmt.Fprintf(w, "%s\t%s\t%s\t-\t-\t-\t%s\n", n.Name, n.Kind, n.Netns, state)
		}
		for i, ifc := range n.Interfaces {
			name, kind, ns, st := n.Name, n.Kind, n.Netns, state
			if i > 0 {
				name, kind, ns, st = "", "", "", ""
			}
			addrs := strings.Join(ifc.Addrs, ",")
			if addrs == "" {
				addrs = "-"
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", name, kind, ns, ifc.Name, ifc.MAC, addrs, st)
		}
	}
	w.Flush()
}

// loadLab finds the lab a command is about (named, or the only one up).
func loadLab(root, name string) (*lab.State, error) {
	n, err := lab.Resolve(root, name)
	if err != nil {
		return nil, err
	}
	return lab.Load(root, n)
}
