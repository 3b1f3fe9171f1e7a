package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/onehop/onehop/internal/lab"
	"github.com/onehop/onehop/internal/netns"
	"github.com/onehop/onehop/internal/topology"
)

// labFlags are the lab command's persistent flags, shared by its subcommands.
type labFlags struct{ root, name string }

func labCmd() *cobra.Command {
	lf := &labFlags{}
	c := &cobra.Command{
		Use:   "lab",
		Short: "Emulate a data center on this machine: hosts and VMs in network namespaces",
		Long: `A lab is built from a topology file: a fabric namespace with a Linux bridge (the
flat L2 underlay), one namespace per host with an uplink into it and an agent,
one namespace per VM behind a veth pair whose host end (vif-VM) lives in the
host's namespace, and the controller with its embedded etcd on the fabric.
Namespaces are named oh-LAB-NODE, so 'ip netns' and 'nsenter' work on them too.`,
	}
	c.PersistentFlags().StringVar(&lf.root, "root", lab.DefaultRoot, "where labs keep their state")
	c.PersistentFlags().StringVar(&lf.name, "lab", "", "which lab (default: the only one that is up)")
	c.AddCommand(labUpCmd(lf), labDownCmd(lf), labStatusCmd(lf), labExecCmd(lf), labRestartCmd(lf), labMoveCmd(lf), labReaddressCmd(lf), labLinkCmd(lf), labAddHostCmd(lf), labRemoveHostCmd(lf))
	return c
}

func labUpCmd(lf *labFlags) *cobra.Command {
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
			st, err := lab.Up(ctx, t, lab.Options{Root: lf.root, Progress: os.Stderr, Timeout: timeout})
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "Lab %q is up in %.1fs. Next: `onehop lab status`, `onehop lab exec NODE -- CMD`, `onehop lab down`.\n", st.Name, time.Since(start).Seconds())
			return nil
		},
	}
	up.Flags().DurationVar(&timeout, "timeout", 60*time.Second, "how long to wait for the controller and agents")
	return up
}

func labDownCmd(lf *labFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "down",
		Short: "Remove everything the lab made: daemons, namespaces, links, pins, state",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			n, err := lab.Resolve(lf.root, lf.name)
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "Tearing down lab %q:\n", n)
			if err := lab.Down(lf.root, n, os.Stderr); err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "Lab %q is down.\n", n)
			return nil
		},
	}
}

func labStatusCmd(lf *labFlags) *cobra.Command {
	var output outputFormat
	status := &cobra.Command{
		Use:   "status",
		Short: "Show every node of the lab: namespace, interfaces, MACs, IPs, daemons",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := loadLab(lf.root, lf.name)
			if err != nil {
				return err
			}
			r := lab.Status(cmd.Context(), st)
			if output == jsonOutput {
				return printJSON(cmd.OutOrStdout(), r)
			}
			printStatus(cmd.OutOrStdout(), r)
			return nil
		},
	}
	addOutputFlag(status.Flags(), &output)
	return status
}

func labExecCmd(lf *labFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "exec NODE -- COMMAND [ARG...]",
		Short: "Run a command inside a node of the lab (a VM, a sliver, a host, an external, the fabric or the controller)",
		Long: `Runs COMMAND in the node's network namespace, with /sys remounted for it as
'ip netns exec' does. A VM is named by its name, or as FARM/VM or
FARM/SUBNET/VM; a name VMs of several farms have must be one of the latter
(the error lists them). In a sliver it also runs in the sliver's cgroup
(cgroup v2), where the host confines bind() and connect() to the sliver's
ports.`,
		Example: `  onehop lab exec web1 -- ping -c 3 10.1.1.3
  onehop lab exec red/web1 -- ip addr
  onehop lab exec h1 -- curl -s localhost:9100/metrics
  onehop lab exec fabric -- tcpdump -eni br0
  onehop lab exec s1 -- python3 -m http.server 10022`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			n, err := lab.Resolve(lf.root, lf.name)
			if err != nil {
				return err
			}
			st, err := lab.Load(lf.root, n)
			if err != nil {
				return err
			}
			node, err := st.Node(args[0])
			if err != nil {
				return err
			}
			ns := lab.NamespaceOf(n, node)
			if !netns.Exists(ns) {
				return fmt.Errorf("lab %q has no node %q (no namespace %s); `onehop lab status` lists them", n, node, ns)
			}
			// A sliver's commands run in its cgroup, where its host
			// confines bind() and connect() to its lease.
			if err := lab.JoinSliver(st, node); err != nil {
				return err
			}
			return netns.Exec(ns, args[1:])
		},
	}
}

func labRestartCmd(lf *labFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "restart NODE",
		Short: "Restart the daemon of a lab node (a host's agent, or the controller)",
		Long: `Stops the daemon (SIGTERM) and starts it again with the same arguments. Maps and
links are pinned, so traffic between VMs keeps flowing while an agent is down,
and the new agent takes the same maps over and reconciles them.`,
		Example: "  onehop lab restart h1",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := loadLab(lf.root, lf.name)
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
}

func labMoveCmd(lf *labFlags) *cobra.Command {
	var to, subnet string
	move := &cobra.Command{
		Use:   "move VM --to HOST [--subnet FARM/SUBNET]",
		Short: "Move a VM to another host (its address stays; its connections survive), or to another subnet",
		Long: `Tells the controller the VM now runs on HOST, then re-plumbs the VM's vif into
HOST's namespace, as a live migration would: the VM keeps its interface,
address and MAC, and every host's mapping table follows within a second.

With --subnet FARM/SUBNET (another subnet of the VM's farm; HOST may be its own)
the controller gives the VM a new address there, and the VM's eth0 takes it,
with the new virtual MAC and a default route via the new gateway, before its
vif comes up again; its old address comes off. Nothing in the VM restarts:
its processes and sockets stay (its connections carry on only with VNAT).`,
		Example: `  onehop lab move web1 --to h2
  onehop lab move web1 --to h3 --subnet blue/db`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if to == "" {
				return fmt.Errorf("--to is required: the host to move %s to", args[0])
			}
			st, err := loadLab(lf.root, lf.name)
			if err != nil {
				return err
			}
			v, err := lab.Move(st, args[0], to, subnet)
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "Moved %s (%s, MAC %s) to %s.\n", v.FullName(), v.IP, v.MAC, v.Host)
			return nil
		},
	}
	move.Flags().StringVar(&to, "to", "", "the host to move the VM to")
	move.Flags().StringVar(&subnet, "subnet", "", "FARM/SUBNET: move the VM to this subnet of its farm too (a new address there)")
	return move
}

func labReaddressCmd(lf *labFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "readdress NODE",
		Short: "Give an external a new fabric address; its processes and sockets stay",
		Long: `Allocates the external a new fabric address, as the topology allocates
externals' and never one the lab has used before, puts it on the node's eth0 and
takes the old one off. Nothing in the node restarts. A VM gets a new address
by moving to another subnet instead ('onehop lab move VM --to HOST --subnet').`,
		Example: "  onehop lab readdress inet",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := loadLab(lf.root, lf.name)
			if err != nil {
				return err
			}
			old, fresh, err := lab.Readdress(st, args[0])
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "Readdressed %s: %s, was %s.\n", args[0], fresh, old)
			return nil
		},
	}
}

func labLinkCmd(lf *labFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "link NAME down|up",
		Short: "Cut a wide-area path of a cloud-access lab, or restore it",
		Long: `Takes both links of the WAN router NAME down (down) or up again (up): the
gateway's and the xTR's ends lose their carrier, as when a line fails. The
gateway moves its connections' bytes to the other paths and opens a subflow
on this one again once it is back. The links are the lab's wans.`,
		Example: "  onehop lab link wan1 down\n  onehop lab link wan1 up",
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if args[1] != "down" && args[1] != "up" {
				return fmt.Errorf("lab link %s %q: the state is down or up", args[0], args[1])
			}
			st, err := loadLab(lf.root, lf.name)
			if err != nil {
				return err
			}
			if err := lab.SetLink(st, args[0], args[1] == "up"); err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "Link %s is %s.\n", args[0], args[1])
			return nil
		},
	}
}

// cloudState is what lab status adds for a cloud-access node.
func cloudState(c *lab.CloudNode) string {
	var parts []string
	if c.EIDPrefix != "" {
		parts = append(parts, "eids "+c.EIDPrefix)
	}
	for _, p := range c.Paths {
		s := p.WAN + " rloc " + p.RLOC
		if p.EID != "" {
			s += " eid " + p.EID
		}
		parts = append(parts, s)
	}
	if c.Rate != "" {
		parts = append(parts, "rate "+c.Rate)
	}
	if len(c.Ends) > 0 {
		parts = append(parts, "joins "+strings.Join(c.Ends, " and "))
	}
	if c.Via != "" {
		parts = append(parts, "via "+c.Via)
	}
	if len(parts) == 0 {
		return ""
	}
	return ", " + strings.Join(parts, ", ")
}

func printStatus(out io.Writer, r *lab.Report) {
	fmt.Fprintf(out, "lab %s (%s, datapath %s) from %s\n\n", r.Name, r.Phase, r.Datapath, r.Topology)
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
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
		if n.VNAT {
			state += ", vnat"
		}
		if c := n.Cloud; c != nil {
			state += cloudState(c)
		}
		if n.Sliver != nil {
			var ls []string
			for _, l := range n.Sliver.Leases {
				r := fmt.Sprintf("%d-%d", l.Lo, l.Hi)
				if l.Uplink != 0 {
					r = fmt.Sprintf("%d:%s", l.Uplink, r)
				}
				ls = append(ls, r)
			}
			state += fmt.Sprintf(", on %s, ports %s", n.Sliver.Host, strings.Join(ls, ","))
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

func labAddHostCmd(lf *labFlags) *cobra.Command {
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "add-host HOST",
		Short: "Add a host to a lab that is up: 'host add', then its namespace, uplink, certificate and agent",
		Long: `Authorizes HOST with the controller ('onehop host add', with the next free fabric
address), then builds it as 'lab up' builds a host: its namespace oh-LAB-HOST, its
uplink on the fabric bridge, its agent's client certificate from the lab's CA (CN =
HOST) and its agent, which registers its uplink when it starts. It returns once the
agent has reported. 'lab down' removes it with the rest of the lab.`,
		Example: "  onehop lab add-host h4",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := loadLab(lf.root, lf.name)
			if err != nil {
				return err
			}
			h, err := lab.AddHost(cmd.Context(), st, args[0], lab.Options{Progress: os.Stderr, Timeout: timeout})
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "Added host %s (fabric address %s) to lab %s; its agent is up.\n", h.Name, h.Address, st.Name)
			return nil
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 60*time.Second, "how long to wait for the agent")
	return cmd
}

func labRemoveHostCmd(lf *labFlags) *cobra.Command {
	var drain bool
	cmd := &cobra.Command{
		Use:   "remove-host HOST [--drain]",
		Short: "Retire a host of a lab: stop its agent, 'host remove', then remove its namespace",
		Long: `Stops HOST's agent, asks the controller to retire it ('onehop host remove', with
--drain if given) and removes its namespace, certificate, pins and cgroup. When the
controller refuses (VMs, slivers or TAP policies placed there and no --drain), the
agent is started again and the refusal, which names them, is printed.`,
		Example: "  onehop lab remove-host h4 --drain",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := loadLab(lf.root, lf.name)
			if err != nil {
				return err
			}
			if err := lab.RemoveHost(st, args[0], drain, ""); err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "Removed host %s from lab %s.\n", args[0], st.Name)
			return nil
		},
	}
	cmd.Flags().BoolVar(&drain, "drain", false, "delete the VMs, slivers and TAP policies placed on the host instead of refusing")
	return cmd
}
