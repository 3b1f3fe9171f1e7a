package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/onehop/onehop/internal/client"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/policy"
)

func allowCmd() *cobra.Command {
	var proto, asFarm string
	var port uint16
	allow := &cobra.Command{
		Use:   "allow FROM TO [--proto P] [--port N]",
		Short: "Let one subnet open connections to another (one-way; replies pass)",
		Long: `FROM and TO are FARM/SUBNET. The rule belongs to FROM's farm unless --farm says
otherwise. Within a farm it takes effect at once. Across farms it takes effect
only when both farms peer (onehop peer) and both allow it, and then only what
both allow. It prints the rule's id; onehop rule list/get/delete take it.`,
		Example: `  onehop allow blue/web blue/db --proto tcp --port 5432
  onehop allow blue/web red/web --proto tcp --port 80             # blue's side
  onehop allow blue/web red/web --proto tcp --port 80 --farm red  # red's side`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			from, err := splitPath(args[0], 2, "FARM/SUBNET")
			if err != nil {
				return err
			}
			if _, err := splitPath(args[1], 2, "FARM/SUBNET"); err != nil {
				return err
			}
			owner := asFarm
			if owner == "" {
				owner = from[0]
			}
			// The controller's own check, so a mistake names its flag first.
			r, err := policy.NormalizeRule(intent.Rule{From: args[0], To: args[1], Proto: proto, Port: port})
			if err != nil {
				return flagErr(err, map[string]string{"proto": "--proto", "port": "--port"})
			}
			c, err := api()
			if err != nil {
				return err
			}
			if err := c.Do("POST", "/v1/farms/"+owner+"/rules", r, &r); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "farm %s allows %s -> %s %s (rule %d)\n", owner, r.From, r.To, protoPort(r.Proto, r.Port), r.ID)
			return nil
		},
	}
	allow.Flags().StringVar(&proto, "proto", "", "tcp, udp, icmp (default: any)")
	allow.Flags().Uint16Var(&port, "port", 0, "destination port (tcp/udp; default: any)")
	allow.Flags().StringVar(&asFarm, "farm", "", "the farm whose rule this is (default: FROM's farm)")
	return allow
}

func protoPort(proto string, port uint16) string {
	if proto == "" {
		proto = "any"
	}
	if port == 0 {
		return proto
	}
	return fmt.Sprintf("%s/%d", proto, port)
}

var ruleListing = listing{kind: "rules", print: func(c *client.Client, output outputFormat, w io.Writer) error {
	return printRules(c, "", output, w)
}}
