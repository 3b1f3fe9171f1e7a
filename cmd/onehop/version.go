package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/onehop/onehop/internal/version"
)

func versionCmd() *cobra.Command {
	var output outputFormat
	c := &cobra.Command{
		Use:   "version [-o json]",
		Short: "This binary's release, git commit, build date, Go version and BPF objects' digest",
		Long: `Which onehop this is: the release (set by make build and the Debian package;
"dev" otherwise), the git commit and date it was built from, the Go that
built it, and a digest of the eBPF objects it carries. Two binaries with the
same release, commit and digest run the same code and the same datapath.

The controller serves its own at GET /v1/version and on its operations port
(/version); each agent reports its own in its status record, and
` + "`onehop status`" + ` names the hosts whose agent differs from the controller.`,
		Example: "  onehop version\n  onehop --version\n  onehop version -o json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output == jsonOutput {
				return printJSON(cmd.OutOrStdout(), version.Get())
			}
			_, err := fmt.Fprintln(cmd.OutOrStdout(), version.Get())
			return err
		},
	}
	addOutputFlag(c.Flags(), &output)
	return c
}
