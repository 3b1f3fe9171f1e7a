package main

import (
	"fmt"
	"io"
	"net/url"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/onehop/onehop/internal/controller"
)

func auditCmd() *cobra.Command {
	var output outputFormat
	var farm string
	c := &cobra.Command{
		Use:   "audit [--farm FARM] [-o json]",
		Short: "The audit trail: every accepted write, who made it, what and when (oldest first)",
		Long: `Every write the controller accepted: when, who (the identity: admin or a farm's
tenant, and the token or certificate), what (method, path, noun and name, the body
shortened with any secret redacted). The store keeps the newest entries (the
controller's --audit-keep, 10,000 by default), the oldest dropped first. A
tenant's credential lists its own farm's entries only.`,
		Example: "  onehop audit\n  onehop audit --farm blue -o json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var entries []controller.AuditEntry
			if err := getOfFarm("/v1/audit", farm, &entries); err != nil {
				return err
			}
			return printAudit(cmd.OutOrStdout(), entries, output)
		},
	}
	c.Flags().StringVar(&farm, "farm", "", "this farm's entries only")
	addOutputFlag(c.Flags(), &output)
	return c
}

func printAudit(w io.Writer, entries []controller.AuditEntry, output outputFormat) error {
	if output == jsonOutput {
		return printJSON(w, entries)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME\tWHO\tFARM\tWHAT\tNAME\tCHANGE")
	for _, e := range entries {
		farm := e.Farm
		if farm == "" {
			farm = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s %s\t%s\t%s\n", e.Time.Local().Format(time.DateTime), e.Who, farm, e.Method, e.Path, e.Name, e.Change)
	}
	return tw.Flush()
}

// getOfFarm GETs the list at path, farm's items only when farm is not ""
// (?farm=), into out.
func getOfFarm(path, farm string, out any) error {
	c, err := api()
	if err != nil {
		return err
	}
	if farm != "" {
		path += "?farm=" + url.QueryEscape(farm)
	}
	return c.Do("GET", path, nil, out)
}
