package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/onehop/onehop/internal/addrplan"
	"github.com/onehop/onehop/internal/controller"
)

func planCmd() *cobra.Command {
	plan := &cobra.Command{Use: "plan", Short: "The cloud's address plan: its tenant prefix and how it splits between farm, subnet and VM",
		Long: `The address plan is chosen once, when the cloud is created: the tenant prefix
and how its bits split between farm, subnet and VM (docs/addressing.md). The
default, 10.0.0.0/8:8/8/8, is the paper's 10.f.s.h: 255 farms of 255 subnets of
253 VMs; 10.0.0.0/8:12/6/6 holds 4,095 farms of 63 subnets of 61 VMs. The
controller's --plan (or a topology file's plan line) sets it at first start;
once the cloud holds a host or a farm it cannot change.`}
	var output outputFormat
	show := &cobra.Command{
		Use: "show [-o json]", Short: "Show the address plan and how many farms, subnets and VMs it holds", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := api()
			if err != nil {
				return err
			}
			var info controller.PlanInfo
			if err := c.Do("GET", "/v1/plan", nil, &info); err != nil {
				return err
			}
			return printPlan(cmd.OutOrStdout(), info, output)
		},
	}
	addOutputFlag(show.Flags(), &output)
	set := &cobra.Command{
		Use: "set PREFIX:FARM/SUBNET/VM", Short: "Choose the address plan of a cloud that holds no host and no farm yet", Args: cobra.ExactArgs(1),
		Example: "  onehop plan set 10.0.0.0/8:12/6/6",
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := addrplan.Parse(args[0]); err != nil {
				return err
			}
			c, err := api()
			if err != nil {
				return err
			}
			var info controller.PlanInfo
			if err := c.Do("PUT", "/v1/plan", map[string]string{"plan": args[0]}, &info); err != nil {
				return err
			}
			return printPlan(cmd.OutOrStdout(), info, output)
		},
	}
	addOutputFlag(set.Flags(), &output)
	plan.AddCommand(show, set)
	return plan
}

func printPlan(w io.Writer, info controller.PlanInfo, output outputFormat) error {
	if output == jsonOutput {
		return printJSON(w, info)
	}
	fmt.Fprintf(w, "plan %s: prefix %s, %d farm bits, %d subnet bits, %d VM bits\n", info.Plan, info.Prefix, info.FarmBits, info.SubnetBits, info.VMBits)
	fmt.Fprintf(w, "holds %d farms of %d subnets of %d VMs\n", info.MaxFarms, info.MaxSubnets, info.MaxVMs)
	return nil
}
