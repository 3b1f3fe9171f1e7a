package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/onehop/onehop/internal/client"
	"github.com/onehop/onehop/internal/topology"
)

// listing is what `onehop get KIND` prints for one noun; each noun's file
// defines its own and nouns() registers it.
type listing struct {
	kind  string // farms, vms, ...: the argument of `onehop get`
	print func(c *client.Client, output outputFormat, w io.Writer) error
}

// listAndPrint fetches path as a list of T and prints it as JSON or as a table
// of header and one row per item.
func listAndPrint[T any](c *client.Client, path string, output outputFormat, w io.Writer, header string, row func(T) string) error {
	var items []T
	if err := c.Do("GET", path, nil, &items); err != nil {
		return err
	}
	if output == jsonOutput {
		return printJSON(w, items)
	}
	fmt.Fprintln(w, header)
	for _, it := range items {
		fmt.Fprintln(w, row(it))
	}
	return nil
}

func listings() []*listing {
	var out []*listing
	for _, n := range nouns() {
		if n.list != nil {
			out = append(out, n.list)
		}
	}
	return out
}

func getCmd() *cobra.Command {
	var output outputFormat
	ls := listings()
	kinds := make([]string, len(ls))
	for i, l := range ls {
		kinds[i] = l.kind
	}
	get := &cobra.Command{
		Use: "get (" + strings.Join(kinds, "|") + ")", Short: "List intent as the controller holds it", Args: cobra.ExactArgs(1),
		ValidArgs: kinds,
		Example:   "  onehop get vms\n  onehop get rules -o json",
		RunE: func(cmd *cobra.Command, args []string) error {
			var l *listing
			for _, x := range ls {
				if x.kind == args[0] {
					l = x
				}
			}
			if l == nil {
				return fmt.Errorf("get %q: want %s or %s", args[0], strings.Join(kinds[:len(kinds)-1], ", "), kinds[len(kinds)-1])
			}
			c, err := api()
			if err != nil {
				return err
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			defer w.Flush()
			return l.print(c, output, w)
		},
	}
	addOutputFlag(get.Flags(), &output)
	return get
}

// nameArg splits arg, shaped as shape ("FARM/SUBNET"), into one part per
// check and checks each with the controller's own name check, so that a
// malformed name is refused before the controller is asked.
func nameArg(arg, shape string, checks ...func(string) error) ([]string, error) {
	p, err := splitPath(arg, len(checks), shape)
	if err != nil {
		return nil, err
	}
	for i, check := range checks {
		if err := check(p[i]); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// showOne is a noun's get: path's object as JSON (-o json) or as text.
func showOne[T any](cmd *cobra.Command, path string, output outputFormat, text func(T) string) error {
	c, err := api()
	if err != nil {
		return err
	}
	var v T
	if err := c.Do("GET", path, nil, &v); err != nil {
		return err
	}
	if output == jsonOutput {
		return printJSON(cmd.OutOrStdout(), v)
	}
	_, err = fmt.Fprint(cmd.OutOrStdout(), text(v))
	return err
}

// deleteOne is a noun's delete: DELETE path (with ?cascade=true when
// cascade), then "WHAT deleted". A refusal is the controller's message,
// which names what depends on it.
func deleteOne(cmd *cobra.Command, path string, cascade bool, what string) error {
	c, err := api()
	if err != nil {
		return err
	}
	if cascade {
		path += "?cascade=true"
	}
	if err := c.Do("DELETE", path, nil, nil); err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "%s deleted\n", what)
	return nil
}

// listCmd is a noun's list: what `onehop get KIND` prints, from path all
// or, when byFarm is set and --farm FARM given, from byFarm(FARM).
func listCmd(what, all string, byFarm func(farm string) string, print func(c *client.Client, path string, output outputFormat, w io.Writer) error) *cobra.Command {
	var farm string
	var output outputFormat
	cmd := &cobra.Command{
		Use: "list [-o json]", Short: "List " + what, Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			path := all
			if farm != "" {
				if err := topology.CheckFarmName(farm); err != nil {
					return fmt.Errorf("--farm: %w", err)
				}
				path = byFarm(farm)
			}
			c, err := api()
			if err != nil {
				return err
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			defer w.Flush()
			return print(c, path, output, w)
		},
	}
	if byFarm != nil {
		cmd.Use = "list [--farm FARM] [-o json]"
		cmd.Flags().StringVar(&farm, "farm", "", "only this farm's")
	}
	addOutputFlag(cmd.Flags(), &output)
	return cmd
}
