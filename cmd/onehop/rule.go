package main

import (
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/onehop/onehop/internal/client"
	"github.com/onehop/onehop/internal/controller"
	"github.com/onehop/onehop/internal/topology"
)

// ruleCmd is a farm's visibility rules by id: list, get, delete (onehop
// allow creates them).
func ruleCmd() *cobra.Command {
	rule := &cobra.Command{Use: "rule", Short: "A farm's visibility rules, by id: list, get, delete (onehop allow adds one)"}
	rule.AddCommand(ruleListCmd(), ruleGetCmd(), ruleDeleteCmd())
	return rule
}

func ruleListCmd() *cobra.Command {
	var output outputFormat
	var farm string
	cmd := &cobra.Command{
		Use: "list [--farm F] [-o json]", Short: "List rules with their ids and whether each is in force", Args: cobra.NoArgs,
		Example: "  onehop rule list --farm blue",
		RunE: func(cmd *cobra.Command, args []string) error {
			if farm != "" {
				if err := topology.CheckFarmName(farm); err != nil {
					return fmt.Errorf("--farm: %w", err)
				}
			}
			c, err := api()
			if err != nil {
				return err
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			defer w.Flush()
			return printRules(c, farm, output, w)
		},
	}
	cmd.Flags().StringVar(&farm, "farm", "", "only this farm's rules")
	addOutputFlag(cmd.Flags(), &output)
	return cmd
}

// printRules prints farm's rules ("" every farm's), as `rule list` and
// `get rules` do.
func printRules(c *client.Client, farm string, output outputFormat, w io.Writer) error {
	path := "/v1/rules"
	if farm != "" {
		path = "/v1/farms/" + farm + "/rules"
	}
	return listAndPrint(c, path, output, w, "FARM\tID\tFROM\tTO\tWHAT\tIN FORCE", func(r controller.RuleView) string {
		return fmt.Sprintf("%s\t%d\t%s\t%s\t%s\t%v", r.Farm, r.ID, r.From, r.To, protoPort(r.Proto, r.Port), r.Effective)
	})
}

// ruleCall checks FARM and ID and sends method to the rule's path, its
// answer decoded into out (nil: none).
func ruleCall(method string, args []string, out any) error {
	if err := topology.CheckFarmName(args[0]); err != nil {
		return fmt.Errorf("FARM: %w", err)
	}
	id, err := controller.ParseRuleID("ID", args[1])
	if err != nil {
		return err
	}
	c, err := api()
	if err != nil {
		return err
	}
	return c.Do(method, fmt.Sprintf("/v1/farms/%s/rules/%d", args[0], id), nil, out)
}

func ruleGetCmd() *cobra.Command {
	var output outputFormat
	cmd := &cobra.Command{
		Use: "get FARM ID [-o json]", Short: "Show one rule of a farm", Args: cobra.ExactArgs(2),
		Example: "  onehop rule get blue 3",
		RunE: func(cmd *cobra.Command, args []string) error {
			var v controller.RuleView
			if err := ruleCall("GET", args, &v); err != nil {
				return err
			}
			if output == jsonOutput {
				return printJSON(cmd.OutOrStdout(), v)
			}
			state := "in force"
			if !v.Effective {
				state = "not in force (across farms, both must peer and allow it)"
			}
			fmt.Fprintf(cmd.OutOrStdout(), "rule %d of %s: %s -> %s %s, %s\n", v.ID, v.Farm, v.From, v.To, protoPort(v.Proto, v.Port), state)
			return nil
		},
	}
	addOutputFlag(cmd.Flags(), &output)
	return cmd
}

func ruleDeleteCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "delete FARM ID",
		Short: "Delete a rule: what it alone allowed stops at once, established flows included",
		Long: `Deletes rule ID of FARM (ids as rule list shows them; other rules keep theirs).
New connections it alone allowed are refused at once, and every host cuts the
established flows it admitted at their next packet, counting each under the
drop reason revoked (onehop stats).`,
		Example: "  onehop rule delete blue 3",
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := ruleCall("DELETE", args, nil); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "rule %s of %s deleted\n", args[1], args[0])
			return nil
		},
	}
}
