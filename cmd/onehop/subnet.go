package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/onehop/onehop/internal/client"
	"github.com/onehop/onehop/internal/intent"
)

func subnetCmd() *cobra.Command {
	subnet := &cobra.Command{Use: "subnet", Short: "Subnets of a farm: a /24 each, gateway at .1"}
	subnet.AddCommand(&cobra.Command{
		Use: "create FARM/SUBNET", Short: "Create a subnet", Args: cobra.ExactArgs(1),
		Example: "  onehop subnet create blue/web",
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := splitPath(args[0], 2, "FARM/SUBNET")
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
			fmt.Printf("subnet %s/%s created: %s, gateway %s\n", s.Farm, s.Name, s.Prefix, s.Gateway)
			return nil
		},
	})
	return subnet
}

var subnetListing = listing{kind: "subnets", print: func(c *client.Client, output outputFormat, w io.Writer) error {
	return listAndPrint(c, "/v1/subnets", output, w, "SUBNET\tPREFIX\tGATEWAY", func(s intent.Subnet) string {
		return fmt.Sprintf("%s/%s\t%s\t%s", s.Farm, s.Name, s.Prefix, s.Gateway)
	})
}}
