package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/onehop/onehop/internal/client"
	"github.com/onehop/onehop/internal/egressspec"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/topology"
)

func subnetCmd() *cobra.Command {
	subnet := &cobra.Command{Use: "subnet", Short: "Subnets of a farm: a /24 each, gateway at .1"}
	subnet.AddCommand(&cobra.Command{
		Use: "create FARM/SUBNET", Short: "Create a subnet", Args: cobra.ExactArgs(1),
		Example: "  onehop subnet create blue/web",
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := subnetArg(args[0])
			if err != nil {
				return err
			}
			c, err := api()
			if err != nil {
				return err
			}
			var s intent.Subnet
			if err := c.Do("POST", "/v1/farms/"+p[0]+"/subnets", map[string]string{"name": p[1]}, &s); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "subnet %s/%s created: %s, gateway %s\n", s.Farm, s.Name, s.Prefix, s.Gateway)
			return nil
		},
	})
	subnet.AddCommand(listCmd("subnets with their prefixes and gateways", "/v1/subnets",
		func(farm string) string { return "/v1/farms/" + farm + "/subnets" }, printSubnets), subnetGetCmd(), subnetSetCmd(), subnetDeleteCmd())
	return subnet
}

// subnetArg checks FARM/SUBNET with the controller's name checks.
func subnetArg(arg string) ([]string, error) {
	return nameArg(arg, "FARM/SUBNET", topology.CheckFarmName, topology.CheckSubnetName)
}

func subnetGetCmd() *cobra.Command {
	var output outputFormat
	cmd := &cobra.Command{
		Use: "get FARM/SUBNET [-o json]", Short: "Show one subnet", Args: cobra.ExactArgs(1),
		Example: "  onehop subnet get blue/web",
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := subnetArg(args[0])
			if err != nil {
				return err
			}
			return showOne(cmd, "/v1/farms/"+p[0]+"/subnets/"+p[1], output, func(s intent.Subnet) string {
				return fmt.Sprintf("subnet %s/%s: id %d, %s, gateway %s, egress %s\n", s.Farm, s.Name, s.ID, s.Prefix, s.Gateway, subnetEgressSummary(s.Egress))
			})
		},
	}
	addOutputFlag(cmd.Flags(), &output)
	return cmd
}

// subnetEgressSummary is a subnet's own egress setting in a few words.
func subnetEgressSummary(e *intent.SubnetEgress) string {
	switch {
	case e == nil:
		return "as its farm's"
	case e.Off:
		return "off (its own)"
	}
	return farmEgressSummary(&intent.FarmEgress{To: e.To, Slice: e.Slice}) + " (its own)"
}

func subnetSetCmd() *cobra.Command {
	var on, inherit bool
	var to string
	var slice int
	var output outputFormat
	cmd := &cobra.Command{
		Use:   "set FARM/SUBNET --egress [--egress-to CIDR,...] [--egress-slice N] | --egress=false | --egress-as-farm [-o json]",
		Short: "Change a subnet's settings: its own egress, which overrides its farm's", Args: cobra.ExactArgs(1),
		Long: `--egress and --egress=false give the subnet its own egress setting, which
overrides its farm's (onehop farm set): its VMs get slices (or lose them) as
the subnet says, whatever the farm's setting is. --egress-as-farm drops the
subnet's own setting: the farm's applies again. See docs/north-south.md.`,
		Example: "  onehop subnet set blue/db --egress=false\n  onehop subnet set blue/web --egress --egress-slice 1024\n  onehop subnet set blue/db --egress-as-farm",
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := subnetArg(args[0])
			if err != nil {
				return err
			}
			set := cmd.Flags().Changed("egress")
			switch {
			case set && inherit:
				return fmt.Errorf("--egress and --egress-as-farm: give one")
			case !set && !inherit:
				return fmt.Errorf("nothing to set: give --egress, --egress=false or --egress-as-farm")
			case inherit && (cmd.Flags().Changed("egress-to") || cmd.Flags().Changed("egress-slice")):
				return fmt.Errorf("--egress-as-farm takes no --egress-to or --egress-slice: the farm's apply")
			}
			c, err := api()
			if err != nil {
				return err
			}
			path := "/v1/farms/" + p[0] + "/subnets/" + p[1] + "/egress"
			var sub intent.Subnet
			if inherit {
				err = c.Do("DELETE", path, nil, &sub)
			} else {
				s, serr := egressSetting(cmd, on, to, slice)
				if serr != nil {
					return serr
				}
				err = c.Do("PUT", path, s, &sub)
			}
			if err != nil {
				return err
			}
			if output == jsonOutput {
				return printJSON(cmd.OutOrStdout(), sub)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "subnet %s/%s: egress %s\n", sub.Farm, sub.Name, subnetEgressSummary(sub.Egress))
			return nil
		},
	}
	addOutputFlag(cmd.Flags(), &output)
	cmd.Flags().BoolVar(&on, "egress", false, "let the subnet's VMs reach outside the tenant space (false: not, whatever the farm's setting)")
	cmd.Flags().BoolVar(&inherit, "egress-as-farm", false, "drop the subnet's own egress setting: the farm's applies")
	cmd.Flags().StringVar(&to, "egress-to", "", "the IPv4 prefixes they may reach, comma-separated (default anywhere)")
	cmd.Flags().IntVar(&slice, "egress-slice", 0, fmt.Sprintf("ports of the host's address per VM (%d..%d, default %d)", egressspec.MinSlice, egressspec.MaxSlice, egressspec.DefaultSlice))
	return cmd
}

func subnetDeleteCmd() *cobra.Command {
	var cascade bool
	cmd := &cobra.Command{
		Use: "delete FARM/SUBNET [--cascade]", Short: "Delete a subnet; refused while anything depends on it, unless --cascade", Args: cobra.ExactArgs(1),
		Long: `Deletes the subnet and frees its id and its VMs' addresses for the next ones.

The controller refuses, naming each, while the subnet has VMs, a rule (of any
farm) names it, or a TAP policy names it or one of its VMs. --cascade deletes
them first, each as its own delete does.`,
		Example: "  onehop subnet delete blue/db\n  onehop subnet delete blue/db --cascade",
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := subnetArg(args[0])
			if err != nil {
				return err
			}
			return deleteOne(cmd, "/v1/farms/"+p[0]+"/subnets/"+p[1], cascade, "subnet "+args[0])
		},
	}
	cmd.Flags().BoolVar(&cascade, "cascade", false, "delete what depends on the subnet first (its VMs, rules naming it, TAP policies)")
	return cmd
}

func printSubnets(c *client.Client, path string, output outputFormat, w io.Writer) error {
	return listAndPrint(c, path, output, w, "SUBNET\tPREFIX\tGATEWAY\tEGRESS", func(s intent.Subnet) string {
		return fmt.Sprintf("%s/%s\t%s\t%s\t%s", s.Farm, s.Name, s.Prefix, s.Gateway, subnetEgressSummary(s.Egress))
	})
}

var subnetListing = listing{kind: "subnets", print: func(c *client.Client, output outputFormat, w io.Writer) error {
	return printSubnets(c, "/v1/subnets", output, w)
}}
