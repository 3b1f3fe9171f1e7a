package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

func peerCmd() *cobra.Command {
	peer := &cobra.Command{
		Use: "peer FARM OTHER", Short: "Let FARM talk to OTHER; takes effect once OTHER peers back", Args: cobra.ExactArgs(2),
		Example: "  onehop peer blue red && onehop peer red blue",
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := api()
			if err != nil {
				return err
			}
			var out struct{ Mutual bool }
			if err := c.Do("PUT", "/v1/farms/"+args[0]+"/peers/"+args[1], nil, &out); err != nil {
				return err
			}
			if out.Mutual {
				fmt.Fprintf(cmd.OutOrStdout(), "%s and %s peer with each other: rules both allow now apply\n", args[0], args[1])
			} else {
				fmt.Fprintf(cmd.OutOrStdout(), "%s peers with %s; nothing flows until %s peers back\n", args[0], args[1], args[1])
			}
			return nil
		},
	}
	return peer
}

func unpeerCmd() *cobra.Command {
	var cascade bool
	unpeer := &cobra.Command{
		Use:   "unpeer FARM OTHER [--cascade]",
		Short: "Withdraw FARM's half of its peering with OTHER: traffic between them stops at once",
		Long: `Withdraws FARM's agreement to talk to OTHER. Nothing flows between the two farms
any more, whatever rules either allows: new connections are refused at once,
and every host cuts the established ones at their next packet, counting each
under the drop reason revoked (onehop stats). A cross-farm TAP policy whose
monitor watches the other farm relies on the peering: unpeer refuses, naming
it, unless --cascade, which deletes those policies first.`,
		Example: "  onehop unpeer blue red\n  onehop unpeer blue red --cascade",
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := api()
			if err != nil {
				return err
			}
			path := "/v1/farms/" + args[0] + "/peers/" + args[1]
			if cascade {
				path += "?cascade=true"
			}
			if err := c.Do("DELETE", path, nil, nil); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s no longer peers with %s: nothing flows between them\n", args[0], args[1])
			return nil
		},
	}
	unpeer.Flags().BoolVar(&cascade, "cascade", false, "delete the cross-farm TAP policies that rely on the peering first")
	return unpeer
}
