package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/onehop/onehop/internal/client"
	"github.com/onehop/onehop/internal/intent"
)

func farmCmd() *cobra.Command {
	farm := &cobra.Command{Use: "farm", Short: "Tenant farms: each one its own network, 10.f.0.0/16"}
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
			fmt.Printf("farm %s created: 10.%d.0.0/16%s\n", f.Name, f.ID, extra)
			return nil
		},
	}
	farmCreate.Flags().BoolVar(&proxyARP, "proxy-arp", false, "answer VMs' ARP for other subnets with the gateway's MAC")
	farm.AddCommand(farmCreate)
	return farm
}

var farmListing = listing{kind: "farms", print: func(c *client.Client, output outputFormat, w io.Writer) error {
	return listAndPrint(c, "/v1/farms", output, w, "FARM\tID\tADDRESSES\tPEERS\tRULES", func(f intent.Farm) string {
		return fmt.Sprintf("%s\t%d\t10.%d.0.0/16\t%s\t%d", f.Name, f.ID, f.ID, strings.Join(f.Peers, ","), len(f.Rules))
	})
}}
