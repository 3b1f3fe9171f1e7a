package main

import (
	"fmt"
	"io"
	"net/url"
	"strings"

	"github.com/spf13/cobra"

	"github.com/onehop/onehop/internal/client"
	"github.com/onehop/onehop/internal/controller"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/topology"
)

func hostCmd() *cobra.Command {
	host := &cobra.Command{Use: "host", Short: "Hosts: the hypervisors VMs and slivers are placed on; add and retire them",
		Example: "  onehop host add h4\n  onehop host list\n  onehop host get h4\n  onehop host delete h4 --cascade"}
	var address string
	add := &cobra.Command{
		Use: "add HOST [--address IPV4]", Short: "Authorize a new host; its agent registers its uplink when it starts", Args: cobra.ExactArgs(1),
		Long: `Authorize HOST: VMs and slivers may be placed on it from now on. Start its agent
(onehop agent --node HOST ...) with a certificate from the CA whose CN is HOST; the
agent registers its uplink (its MAC and address on the fabric) when it starts, and
the other hosts learn it from there. --address, the host's IPv4 on the fabric, is
optional. In a lab, 'onehop lab add-host HOST' does this and builds the host.`,
		Example: "  onehop host add h4\n  onehop host add h4 --address 192.168.100.14",
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := topology.CheckHostName(args[0]); err != nil {
				return err
			}
			c, err := api()
			if err != nil {
				return err
			}
			var h intent.Host
			if err := c.Do("POST", "/v1/hosts", intent.Host{Name: args[0], Address: address}, &h); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "host %s added%s\n", h.Name, addressNote(h.Address))
			return nil
		},
	}
	add.Flags().StringVar(&address, "address", "", "the host's IPv4 on the fabric (optional)")
	var cascade, drain bool
	del := &cobra.Command{
		Use: "delete HOST [--cascade]", Aliases: []string{"remove"},
		Short: "Retire a host and every key of it; refused while guests are placed there, unless --cascade", Args: cobra.ExactArgs(1),
		Long: `Retire HOST: its record, its desired state and its agent's node and status records
leave the store. While VMs, slivers, or TAP policies naming a VM there are placed on
it, the controller refuses and names them; --cascade (or --drain, its first name)
deletes them first, each as its own delete does. Stop the host's agent first: a
running agent registers again. In a lab, 'onehop lab remove-host HOST' does this
and removes the host.`,
		Example: "  onehop host delete h4\n  onehop host delete h4 --cascade",
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := topology.CheckHostName(args[0]); err != nil {
				return err
			}
			c, err := api()
			if err != nil {
				return err
			}
			return removeHost(c, args[0], cascade || drain, cmd.OutOrStdout())
		},
	}
	del.Flags().BoolVar(&cascade, "cascade", false, "delete the VMs, slivers and TAP policies placed on the host instead of refusing")
	del.Flags().BoolVar(&drain, "drain", false, "the same as --cascade")
	var output outputFormat
	get := &cobra.Command{
		Use: "get HOST [-o json]", Short: "Show one host and the VMs and slivers placed on it", Args: cobra.ExactArgs(1),
		Example: "  onehop host get h1",
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := topology.CheckHostName(args[0]); err != nil {
				return err
			}
			return showOne(cmd, "/v1/hosts/"+args[0], output, func(h controller.HostView) string {
				return fmt.Sprintf("host %s%s: vms %s; slivers %s\n", h.Name, addressNote(h.Address), listOrNone(h.VMs), listOrNone(h.Slivers))
			})
		},
	}
	addOutputFlag(get.Flags(), &output)
	host.AddCommand(add, del, get, listCmd("hosts with their fabric addresses", "/v1/hosts", nil, printHosts))
	return host
}

func listOrNone(names []string) string {
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

// removeHost asks the controller to retire host, deleting what is placed
// on it first if cascade.
func removeHost(c *client.Client, host string, cascade bool, out io.Writer) error {
	path := "/v1/hosts/" + url.PathEscape(host)
	if cascade {
		path += "?cascade=true"
	}
	if err := c.Do("DELETE", path, nil, nil); err != nil {
		return err
	}
	fmt.Fprintf(out, "host %s removed\n", host)
	return nil
}

func addressNote(a string) string {
	if a == "" {
		return ""
	}
	return " (fabric address " + a + ")"
}

func printHosts(c *client.Client, path string, output outputFormat, w io.Writer) error {
	return listAndPrint(c, path, output, w, "HOST\tFABRIC ADDRESS", func(h intent.Host) string {
		return fmt.Sprintf("%s\t%s", h.Name, h.Address)
	})
}

// Hosts come from the topology and from host add.
var hostListing = listing{kind: "hosts", print: func(c *client.Client, output outputFormat, w io.Writer) error {
	return printHosts(c, "/v1/hosts", output, w)
}}
