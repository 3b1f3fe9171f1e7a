package main

import (
	"github.com/spf13/cobra"

	"github.com/onehop/onehop/internal/netns"
)

func netnsExecCmd() *cobra.Command {
	return &cobra.Command{
		Use:    "netns-exec NETNS -- COMMAND [ARG...]",
		Short:  "Run a command inside a named network namespace (used to start daemons)",
		Hidden: true,
		Args:   cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return netns.Exec(args[0], args[1:])
		},
	}
}
