package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/onehop/onehop/internal/controller"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/version"
)

func statusCmd() *cobra.Command {
	var output outputFormat
	c := &cobra.Command{
		Use: "status [-o json]", Short: "The control plane: the store's size, quota and alarms, the agents reporting, and which run another version", Args: cobra.NoArgs,
		Long: `The store (etcd) as the controller last measured it (every 30 s): its database
file's size and the part of it holding data, the quota beyond which etcd raises
NOSPACE and refuses every write, its revision and the one last compacted to,
and its alarms; then how many agents report and how many of them report an
error; then the controller's version and every host whose agent runs another
(release, commit or BPF objects: onehop version), as during a rolling
upgrade. docs/control-plane.md says how the store is kept small,
docs/operations.md how to upgrade.`,
		Example: "  onehop status\n  onehop status -o json",
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := api()
			if err != nil {
				return err
			}
			var r statusReport
			if err := c.Do("GET", "/v1/store", nil, &r.Store); err != nil {
				return err
			}
			var sts []intent.AgentStatus
			if err := c.Do("GET", "/v1/status", nil, &sts); err != nil {
				return err
			}
			var ctl version.Info
			if err := c.Do("GET", "/v1/version", nil, &ctl); err != nil {
				return fmt.Errorf("the controller's version: %w", err)
			}
			r.fill(ctl, sts)
			if output == jsonOutput {
				return printJSON(cmd.OutOrStdout(), r)
			}
			printStoreStatus(cmd.OutOrStdout(), r.Store, sts)
			printVersions(cmd.OutOrStdout(), r)
			return nil
		},
	}
	addOutputFlag(c.Flags(), &output)
	return c
}

// statusReport is what `onehop status -o json` prints.
type statusReport struct {
	Store      controller.StoreStatus `json:"store"`
	Controller version.Info           `json:"controller"`
	Agents     int                    `json:"agents"`
	// Failing are the hosts whose agent reports an error.
	Failing []string `json:"failing,omitempty"`
	// OtherVersions are the hosts whose agent runs another version than
	// the controller (or says none: an agent older than versions).
	OtherVersions []hostVersion `json:"otherVersions,omitempty"`
}

// hostVersion is one host whose agent's version is not the controller's.
type hostVersion struct {
	Node    string        `json:"node"`
	Version *version.Info `json:"version,omitempty"`
	// Differs says how, for a person.
	Differs string `json:"differs"`
}

func (r *statusReport) fill(ctl version.Info, sts []intent.AgentStatus) {
	r.Controller, r.Agents = ctl, len(sts)
	for _, a := range sts {
		if a.Error != "" {
			r.Failing = append(r.Failing, a.Node)
		}
		switch {
		case a.Version == nil:
			r.OtherVersions = append(r.OtherVersions, hostVersion{Node: a.Node, Differs: "reports no version (an agent older than onehop version)"})
		case !ctl.Same(*a.Version):
			r.OtherVersions = append(r.OtherVersions, hostVersion{Node: a.Node, Version: a.Version, Differs: ctl.Mismatch(*a.Version)})
		}
	}
	slices.Sort(r.Failing)
	slices.SortFunc(r.OtherVersions, func(a, b hostVersion) int { return strings.Compare(a.Node, b.Node) })
}

// printVersions writes the controller's version and the hosts whose agent
// runs another.
func printVersions(w io.Writer, r statusReport) {
	fmt.Fprintf(w, "controller %s\n", r.Controller)
	if len(r.OtherVersions) == 0 {
		fmt.Fprintf(w, "versions   every agent runs the controller's\n")
		return
	}
	fmt.Fprintf(w, "versions   %d of %d agents run another version than the controller:\n", len(r.OtherVersions), r.Agents)
	for _, h := range r.OtherVersions {
		fmt.Fprintf(w, "  %-12s %s\n", h.Node, h.Differs)
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
