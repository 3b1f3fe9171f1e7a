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
				fmt.Printf("%s and %s peer with each other: rules both allow now apply\n", args[0], args[1])
			} else {
				fmt.Printf("%s peers with %s; nothing flows until %s peers back\n", args[0], args[1], args[1])
			}
			return nil
		},
	}
	return peer
}
