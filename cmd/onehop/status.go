package main

import (
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/onehop/onehop/internal/controller"
	"github.com/onehop/onehop/internal/intent"
)

func statusCmd() *cobra.Command {
	return &cobra.Command{
		Use: "status", Short: "The control plane: the store's size, quota and alarms, and how many agents report", Args: cobra.NoArgs,
		Long: `The store (etcd) as the controller last measured it (every 30 s): its database
file's size and the part of it holding data, the quota beyond which etcd raises
NOSPACE and refuses every write, its revision and the one last compacted to,
and its alarms; then how many agents report and how many of them report an
error. docs/control-plane.md says how the store is kept small.`,
		Example: "  onehop status",
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := api()
			if err != nil {
				return err
			}
			var st controller.StoreStatus
			if err := c.Do("GET", "/v1/store", nil, &st); err != nil {
				return err
			}
			var sts []intent.AgentStatus
			if err := c.Do("GET", "/v1/status", nil, &sts); err != nil {
				return err
			}
			printStoreStatus(cmd.OutOrStdout(), st, sts)
			return nil
		},
	}
}

// printStoreStatus writes what `onehop status` shows.
func printStoreStatus(w io.Writer, st controller.StoreStatus, sts []intent.AgentStatus) {
	pct := 0.0
	if st.Quota > 0 {
		pct = 100 * float64(st.DBSize) / float64(st.Quota)
	}
	fmt.Fprintf(w, "store      etcd %s at %s\n", st.Version, st.Endpoint)
	fmt.Fprintf(w, "database   %s (%s in use) of a %s quota (%.1f%%)\n", mib(st.DBSize), mib(st.DBSizeInUse), mib(st.Quota), pct)
	comp := "by etcd itself (auto-compaction)"
	if st.CompactedRevision > 0 {
		comp = fmt.Sprintf("to %d by the controller (%d compactions)", st.CompactedRevision, st.Compactions)
	}
	fmt.Fprintf(w, "revision   %d, compacted %s\n", st.Revision, comp)
	defrag := "never"
	if !st.LastDefrag.IsZero() {
		defrag = fmt.Sprintf("%s ago (%d in all)", time.Since(st.LastDefrag).Round(time.Second), st.Defrags)
	}
	fmt.Fprintf(w, "defrag     %s\n", defrag)
	switch {
	case st.NoSpace:
		fmt.Fprintf(w, "alarms     NOSPACE: etcd refuses every write until room is made (%v)\n", st.Alarms)
	case len(st.Alarms) > 0:
		fmt.Fprintf(w, "alarms     %v\n", st.Alarms)
	default:
		fmt.Fprintf(w, "alarms     none\n")
	}
	if st.Error != "" {
		fmt.Fprintf(w, "error      %s (as of %s)\n", st.Error, st.Checked.Format(time.RFC3339))
	}
	failing := 0
	for _, a := range sts {
		if a.Error != "" {
			failing++
		}
	}
	fmt.Fprintf(w, "agents     %d reporting, %d with an error (onehop stats says more)\n", len(sts), failing)
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
