package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"

	"github.com/onehop/onehop/internal/version"
)

// manCmd writes a man page per command (cobra's generator): make man and
// make package run it. Hidden: it is a build step, not an operator's verb.
func manCmd() *cobra.Command {
	return &cobra.Command{
		Use:    "man DIR",
		Short:  "Write the man pages of every command to DIR (onehop.1, onehop-status.1, ...)",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := os.MkdirAll(args[0], 0o755); err != nil {
				return fmt.Errorf("man DIR %s: %w", args[0], err)
			}
			root := cmd.Root()
			root.DisableAutoGenTag = true // the same tree makes the same pages
			h := &doc.GenManHeader{Title: "ONEHOP", Section: "1", Source: "onehop " + version.Get().Version, Manual: "onehop manual"}
			if err := doc.GenManTree(root, h, args[0]); err != nil {
				return fmt.Errorf("man pages into %s: %w", args[0], err)
			}
			return nil
		},
	}
}
