package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/onehop/onehop/internal/addrplan"
	"github.com/onehop/onehop/internal/client"
	"github.com/onehop/onehop/internal/controller"
	"github.com/onehop/onehop/internal/egressspec"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/topology"
)

func farmCmd() *cobra.Command {
	farm := &cobra.Command{Use: "farm", Short: "Tenant farms: each one its own network, 10.f.0.0/16",
		Example: "  onehop farm create blue\n  onehop farm list\n  onehop farm get blue\n  onehop farm delete blue --cascade"}
	var proxyARP bool
	farmCreate := &cobra.Command{
		Use: "create FARM [--proxy-arp]", Short: "Create a farm (its id is the f of 10.f.s.h)", Args: cobra.ExactArgs(1),
		Long: `Create a farm: a tenant's network of up to 254 subnets, 10.f.0.0/16.

With --proxy-arp, a VM's ARP for an address of another subnet is answered with
its gateway's MAC (for guests configured with a netmask wider than their /24);
without it such ARP is dropped, as on a real router.`,
		Example: "  onehop farm create blue\n  onehop farm create legacy --proxy-arp",
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := api()
			if err != nil {
				return err
			}
			var f intent.Farm
			if err := c.Do("POST", "/v1/farms", map[string]any{"name": args[0], "proxyARP": proxyARP}, &f); err != nil {
				return err
			}
			extra := ""
			if f.ProxyARP {
				extra = ", proxy ARP on"
			}
			plan, err := cloudPlan(c)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "farm %s created: %s%s\n", f.Name, plan.FarmPrefix(f.ID), extra)
			return nil
		},
	}
	farmCreate.Flags().BoolVar(&proxyARP, "proxy-arp", false, "answer VMs' ARP for other subnets with the gateway's MAC")
	farm.AddCommand(farmCreate, farmSetCmd(), listCmd("farms with their ids, peers and rules", "/v1/farms", nil, printFarms), farmGetCmd(), farmDeleteCmd())
	return farm
}

func farmGetCmd() *cobra.Command {
	var output outputFormat
	cmd := &cobra.Command{
		Use: "get FARM [-o json]", Short: "Show one farm: its id, peers and rules", Args: cobra.ExactArgs(1),
		Example: "  onehop farm get blue\n  onehop farm get blue -o json",
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := topology.CheckFarmName(args[0]); err != nil {
				return err
			}
			c, err := api()
			if err != nil {
				return err
			}
			plan, err := cloudPlan(c)
			if err != nil {
				return err
			}
			return showOne(cmd, "/v1/farms/"+args[0], output, func(f intent.Farm) string {
				var b strings.Builder
				fmt.Fprintf(&b, "farm %s: id %d, %s, proxy ARP %s, egress %s\n", f.Name, f.ID, plan.FarmPrefix(f.ID), onOff(f.ProxyARP), farmEgressSummary(f.Egress))
				if len(f.Peers) > 0 {
					fmt.Fprintf(&b, "peers: %s\n", strings.Join(f.Peers, ", "))
				}
				for _, r := range f.Rules {
					fmt.Fprintf(&b, "rule: %s -> %s %s\n", r.From, r.To, protoPort(r.Proto, r.Port))
				}
				return b.String()
			})
		},
	}
	addOutputFlag(cmd.Flags(), &output)
	return cmd
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

func farmDeleteCmd() *cobra.Command {
	var cascade bool
	cmd := &cobra.Command{
		Use: "delete FARM [--cascade]", Short: "Delete a farm; refused while anything depends on it, unless --cascade", Args: cobra.ExactArgs(1),
		Long: `Deletes the farm and frees its id (the f of 10.f.s.h) for the next farm.

The controller refuses, naming each, while the farm has subnets or VMs, another
farm's rule names one of its subnets or peers with it, or a TAP policy names
one of its VMs or subnets. --cascade deletes them first, each as its own delete
does: nothing of the farm is left in the store or in any host's datapath.`,
		Example: "  onehop farm delete blue\n  onehop farm delete blue --cascade",
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := topology.CheckFarmName(args[0]); err != nil {
				return err
			}
			return deleteOne(cmd, "/v1/farms/"+args[0], cascade, "farm "+args[0])
		},
	}
	cmd.Flags().BoolVar(&cascade, "cascade", false, "delete what depends on the farm first (its subnets and VMs, rules and peerings naming it, TAP policies)")
	return cmd
}

func printFarms(c *client.Client, path string, output outputFormat, w io.Writer) error {
	plan, err := cloudPlan(c)
	if err != nil {
		return err
	}
	return listAndPrint(c, path, output, w, "FARM\tID\tADDRESSES\tPEERS\tRULES", func(f intent.Farm) string {
		return fmt.Sprintf("%s\t%d\t%s\t%s\t%d", f.Name, f.ID, plan.FarmPrefix(f.ID), strings.Join(f.Peers, ","), len(f.Rules))
	})
}

// cloudPlan is the cloud's address plan, asked of the controller: a farm's
// addresses follow it (docs/addressing.md).
func cloudPlan(c *client.Client) (addrplan.Plan, error) {
	var info controller.PlanInfo
	if err := c.Do("GET", "/v1/plan", nil, &info); err != nil {
		return addrplan.Plan{}, err
	}
	return addrplan.Parse(info.Plan)
}

var farmListing = listing{kind: "farms", print: func(c *client.Client, output outputFormat, w io.Writer) error {
	return printFarms(c, "/v1/farms", output, w)
}}

// farmEgressSummary is a farm's egress setting in a line.
func farmEgressSummary(e *intent.FarmEgress) string {
	if e == nil {
		return "off"
	}
	return fmt.Sprintf("on to %s, slices of %d ports", strings.Join(e.To, ","), e.Slice)
}

// egressSetting is what --egress, --egress-to and --egress-slice say,
// checked as the controller checks it.
func egressSetting(cmd *cobra.Command, on bool, to string, slice int) (egressspec.Setting, error) {
	s := egressspec.Setting{Enabled: on, Slice: slice}
	if cmd.Flags().Changed("egress-to") {
		list, err := egressspec.ParseTo(to)
		if err != nil {
			return s, fmt.Errorf("--egress-to: %w", err)
		}
		s.To = list
	}
	if on {
		if _, err := egressspec.Farm(s); err != nil {
			return s, fmt.Errorf("--egress: %w", err)
		}
	}
	return s, nil
}

func farmSetCmd() *cobra.Command {
	var on bool
	var to string
	var slice int
	var output outputFormat
	cmd := &cobra.Command{
		Use: "set FARM --egress [--egress-to CIDR,...] [--egress-slice N] | --egress=false [-o json]", Short: "Change a farm's settings: egress to outside the tenant space", Args: cobra.ExactArgs(1),
		Long: `With --egress, the farm's VMs reach addresses outside the tenant space through
their own host's address: each VM gets a slice of that address's ports
(--egress-slice, ` + fmt.Sprint(egressspec.MinSlice) + `..` + fmt.Sprint(egressspec.MaxSlice) + `, default ` + fmt.Sprint(egressspec.DefaultSlice) + `), one connection per port, and may reach
only the prefixes of --egress-to (default anywhere). --egress=false takes the
slices back. See docs/north-south.md.`,
		Example: "  onehop farm set blue --egress\n  onehop farm set blue --egress --egress-to 192.0.2.0/24,198.51.100.0/24 --egress-slice 512\n  onehop farm set blue --egress=false",
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := topology.CheckFarmName(args[0]); err != nil {
				return err
			}
			if !cmd.Flags().Changed("egress") {
				return fmt.Errorf("nothing to set: give --egress (or --egress=false)")
			}
			s, err := egressSetting(cmd, on, to, slice)
			if err != nil {
				return err
			}
			c, err := api()
			if err != nil {
				return err
			}
			var f intent.Farm
			if err := c.Do("PUT", "/v1/farms/"+args[0]+"/egress", s, &f); err != nil {
				return err
			}
			if output == jsonOutput {
				return printJSON(cmd.OutOrStdout(), f)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "farm %s: egress %s\n", f.Name, farmEgressSummary(f.Egress))
			return nil
		},
	}
	addOutputFlag(cmd.Flags(), &output)
	cmd.Flags().BoolVar(&on, "egress", false, "let the farm's VMs reach outside the tenant space through their host's address")
	cmd.Flags().StringVar(&to, "egress-to", "", "the IPv4 prefixes they may reach, comma-separated (default anywhere)")
	cmd.Flags().IntVar(&slice, "egress-slice", 0, fmt.Sprintf("ports of the host's address per VM (%d..%d, default %d)", egressspec.MinSlice, egressspec.MaxSlice, egressspec.DefaultSlice))
	return cmd
}
