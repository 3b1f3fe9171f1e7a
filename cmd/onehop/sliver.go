package main

import (
	"fmt"
	"io"
	"net/url"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/onehop/onehop/internal/client"
	"github.com/onehop/onehop/internal/controller"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/lab"
	"github.com/onehop/onehop/internal/lease"
)

const sliverLong = `A sliver is a guest that shares its host's public IPv4 address and MAC:
no NAT, no private address, so what its applications see and advertise is
their real public endpoint. The host leases each sliver port ranges of that
address; packets for a leased port are steered to the sliver in the kernel,
the host answers everything else (ping, ARP, ports nobody leases), and a
sliver may only send from, bind and connect from its own ports.

Leases: "[UPLINK:]LO-HI[,...]", inclusive, TCP, UDP and ICMP echo ids alike.
  10000-10099                 ports 10000..10099 on uplink 0
  10022                       one port
  10000-10099,1:20000-20099   also 20000..20099 on uplink 1 (a host with two
                              uplinks has two addresses; each lease is on one)

Refused, naming what is in the way: ports another sliver of the host leases
on the same uplink, ports in the host's own ephemeral range (its
net.ipv4.ip_local_port_range, 32768-60999 by default: the host's own
connections take them), an uplink the host does not have, a name the host
already has. Slivers on different hosts never conflict. docs/port-space.md
has the model.`

// sliverHook builds and removes a sliver's namespace in a lab; the lab
// package implements it (internal/lab: AddSliver, RemoveSliver).
type sliverHook interface {
	AddSliver(st *lab.State, s intent.Sliver) error
	RemoveSliver(st *lab.State, host, name string) error
}

// labSliverHook is what `sliver create` and `sliver delete` call when they
// talk to a lab's controller (no --api given), after the controller has
// accepted the change: the lab builds or removes the sliver's namespace.
var labSliverHook sliverHook = labPlumbing{}

// labPlumbing is the lab's own sliver plumbing.
type labPlumbing struct{}

func (labPlumbing) AddSliver(st *lab.State, s intent.Sliver) error { return lab.AddSliver(st, s) }
func (labPlumbing) RemoveSliver(st *lab.State, host, name string) error {
	return lab.RemoveSliver(st, host, name)
}

// sliverLab is the lab the CLI talks to, or nil when --api names a
// controller (then there are no namespaces to build).
func sliverLab() (*lab.State, error) {
	if apiAddr != "" {
		return nil, nil
	}
	name, err := lab.Resolve(lab.DefaultRoot, "")
	if err != nil {
		return nil, fmt.Errorf("no --api given and %w", err)
	}
	return lab.Load(lab.DefaultRoot, name)
}

func sliverCmd() *cobra.Command {
	sl := &cobra.Command{Use: "sliver", Short: "Slivers: guests sharing their host's IPv4 and MAC, told apart by leased port ranges", Long: sliverLong,
		Example: `  onehop sliver create h1/s1 --ports 10000-10099
  onehop sliver create h1/s2 --ports 10100-10199,1:20000-20099
  onehop sliver set h1/s1 --ports 10000-10049
  onehop sliver list --host h1
  onehop sliver delete h1/s2`}
	sl.AddCommand(sliverCreateCmd(), sliverSetCmd(), sliverDeleteCmd(), sliverListCmd())
	return sl
}

func sliverCreateCmd() *cobra.Command {
	var ports string
	cmd := &cobra.Command{
		Use: "create HOST/NAME --ports LEASES", Short: "Create a sliver on HOST leasing LEASES of its address", Args: cobra.ExactArgs(1),
		Long: sliverLong + `

In a lab, create also builds the sliver's namespace: eth<UPLINK> for each
uplink it leases on, carrying the host's address and MAC, with its
ip_local_port_range set to its lease.`,
		Example: `  onehop sliver create h1/s1 --ports 10000-10099
  onehop sliver create h1/s3 --ports 10022              # one port
  onehop sliver create h1/s4 --ports 10300-10399,1:20000-20099`,
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := sliverArgs(args[0], ports)
			if err != nil {
				return err
			}
			st, err := sliverLab()
			if err != nil {
				return err
			}
			c, err := api()
			if err != nil {
				return err
			}
			return createSliver(c, st, p[0], p[1], ports, cmd.OutOrStdout())
		},
	}
	cmd.Flags().StringVar(&ports, "ports", "", `port ranges to lease, "[UPLINK:]LO-HI[,...]"`)
	return cmd
}

// createSliver asks the controller for host/name and, in lab st (nil: no
// lab), has labSliverHook build its namespace.
func createSliver(c *client.Client, st *lab.State, host, name, ports string, out io.Writer) error {
	var v controller.SliverView
	if err := c.Do("POST", "/v1/slivers", map[string]string{"host": host, "name": name, "ports": ports}, &v); err != nil {
		return err
	}
	fmt.Fprintf(out, "sliver %s: slot %d, ports %s\n", v.FullName(), v.Slot, v.Ports)
	if st == nil {
		return nil
	}
	if err := labSliverHook.AddSliver(st, v.Sliver); err != nil {
		// No half-made sliver: the record goes when its namespace cannot
		// be made.
		if derr := c.Do("DELETE", "/v1/slivers/"+host+"/"+name, nil, nil); derr != nil {
			return fmt.Errorf("sliver %s: lab: %w (and removing its record: %v)", v.FullName(), err, derr)
		}
		return fmt.Errorf("sliver %s: lab: %w; its record was removed again", v.FullName(), err)
	}
	fmt.Fprintf(out, "sliver %s: namespace built in lab %s\n", v.FullName(), st.Name)
	return nil
}

// deleteSliver asks the controller to delete host/name and, in lab st
// (nil: no lab), has labSliverHook remove its namespace.
func deleteSliver(c *client.Client, st *lab.State, host, name string, out io.Writer) error {
	if err := c.Do("DELETE", "/v1/slivers/"+host+"/"+name, nil, nil); err != nil {
		return err
	}
	fmt.Fprintf(out, "sliver %s/%s deleted\n", host, name)
	if st == nil {
		return nil
	}
	if err := labSliverHook.RemoveSliver(st, host, name); err != nil {
		return fmt.Errorf("sliver %s/%s: record deleted, but lab: %w", host, name, err)
	}
	fmt.Fprintf(out, "sliver %s/%s: namespace removed from lab %s\n", host, name, st.Name)
	return nil
}

// sliverArgs checks HOST/NAME and the lease list before the controller is
// asked, with the controller's own checks.
func sliverArgs(arg, ports string) ([]string, error) {
	p, err := splitPath(arg, 2, "HOST/NAME")
	if err != nil {
		return nil, err
	}
	if err := lease.CheckSliverName(p[1]); err != nil {
		return nil, err
	}
	if ports == "" {
		return nil, fmt.Errorf(`--ports is required: the port ranges to lease, "[UPLINK:]LO-HI[,...]", e.g. 10000-10099`)
	}
	if _, err := lease.Parse(ports); err != nil {
		return nil, fmt.Errorf("--ports: %w", err)
	}
	return p, nil
}

func sliverSetCmd() *cobra.Command {
	var ports string
	cmd := &cobra.Command{
		Use: "set HOST/NAME --ports LEASES", Short: "Replace a sliver's leases (its slot stays)", Args: cobra.ExactArgs(1),
		Long: `Replaces every lease of the sliver with LEASES, checked as on create.
Other slivers' connections are not disturbed; the sliver's own connections
on ports it no longer leases are cut by its host.`,
		Example: "  onehop sliver set h1/s1 --ports 10000-10199\n  onehop sliver set h1/s1 --ports 10000-10099,1:20000-20099",
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := sliverArgs(args[0], ports)
			if err != nil {
				return err
			}
			c, err := api()
			if err != nil {
				return err
			}
			var v controller.SliverView
			if err := c.Do("PUT", "/v1/slivers/"+p[0]+"/"+p[1], map[string]string{"ports": ports}, &v); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "sliver %s: slot %d, ports %s\n", v.FullName(), v.Slot, v.Ports)
			return nil
		},
	}
	cmd.Flags().StringVar(&ports, "ports", "", `the new port ranges, "[UPLINK:]LO-HI[,...]"`)
	return cmd
}

func sliverDeleteCmd() *cobra.Command {
	return &cobra.Command{
		Use: "delete HOST/NAME", Short: "Delete a sliver; its ports and slot are free again", Args: cobra.ExactArgs(1),
		Long:    "Deletes the sliver's record; in a lab, also removes its namespace and kills what runs in it.",
		Example: "  onehop sliver delete h1/s2",
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := splitPath(args[0], 2, "HOST/NAME")
			if err != nil {
				return err
			}
			st, err := sliverLab()
			if err != nil {
				return err
			}
			c, err := api()
			if err != nil {
				return err
			}
			return deleteSliver(c, st, p[0], p[1], cmd.OutOrStdout())
		},
	}
}

func sliverListCmd() *cobra.Command {
	var host string
	var output outputFormat
	cmd := &cobra.Command{
		Use: "list [--host HOST] [-o json]", Short: "List slivers with their slots and leases", Args: cobra.NoArgs,
		Example: "  onehop sliver list\n  onehop sliver list --host h1 -o json",
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := api()
			if err != nil {
				return err
			}
			path := "/v1/slivers"
			if host != "" {
				path += "?host=" + url.QueryEscape(host)
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			defer w.Flush()
			return printSlivers(c, path, output, w)
		},
	}
	cmd.Flags().StringVar(&host, "host", "", "only this host's slivers")
	addOutputFlag(cmd.Flags(), &output)
	return cmd
}

func printSlivers(c *client.Client, path string, output outputFormat, w io.Writer) error {
	if output == jsonOutput {
		var items []controller.SliverView
		if err := c.Do("GET", path, nil, &items); err != nil {
			return err
		}
		return printJSON(w, items)
	}
	return listAndPrint(c, path, output, w, "SLIVER\tSLOT\tPORTS", func(v controller.SliverView) string {
		return fmt.Sprintf("%s\t%d\t%s", v.FullName(), v.Slot, v.Ports)
	})
}

var sliverListing = listing{kind: "slivers", print: func(c *client.Client, output outputFormat, w io.Writer) error {
	return printSlivers(c, "/v1/slivers", output, w)
}}
