package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/onehop/onehop/internal/client"
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
		func(farm string) string { return "/v1/farms/" + farm + "/subnets" }, printSubnets), subnetGetCmd(), subnetDeleteCmd())
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
				return fmt.Sprintf("subnet %s/%s: id %d, %s, gateway %s\n", s.Farm, s.Name, s.ID, s.Prefix, s.Gateway)
			})
		},
	}
	addOutputFlag(cmd.Flags(), &output)
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
	return listAndPrint(c, path, output, w, "SUBNET\tPREFIX\tGATEWAY", func(s intent.Subnet) string {
		return fmt.Sprintf("%s/%s\t%s\t%s", s.Farm, s.Name, s.Prefix, s.Gateway)
	})
}

var subnetListing = listing{kind: "subnets", print: func(c *client.Client, output outputFormat, w io.Writer) error {
	return printSubnets(c, "/v1/subnets", output, w)
}}
