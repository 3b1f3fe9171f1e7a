package main

import (
	"fmt"
	"os"
	"strconv"
	"time"

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
			date, err := manDate()
			if err != nil {
				return err
			}
			root := cmd.Root()
			root.DisableAutoGenTag = true // the same tree makes the same pages
			h := &doc.GenManHeader{Title: "ONEHOP", Section: "1", Source: "onehop " + version.Get().Version, Manual: "onehop manual", Date: &date}
			if err := doc.GenManTree(root, h, args[0]); err != nil {
				return fmt.Errorf("man pages into %s: %w", args[0], err)
			}
			return nil
		},
	}
}

// manDate is the date the pages carry, so that two builds of one commit
// make the same bytes: $SOURCE_DATE_EPOCH (reproducible-builds.org; make
// man and make package set it to the commit's date), else the binary's
// date (its build's, or its commit's when built without make), else now.
func manDate() (time.Time, error) {
	if epoch := os.Getenv("SOURCE_DATE_EPOCH"); epoch != "" {
		sec, err := strconv.ParseInt(epoch, 10, 64)
		if err != nil {
			return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH %q: want seconds since 1970-01-01 UTC", epoch)
		}
		return time.Unix(sec, 0).UTC(), nil
	}
	if t, err := time.Parse(time.RFC3339, version.Get().Date); err == nil {
		return t.UTC(), nil
	}
	return time.Now().UTC(), nil
}
