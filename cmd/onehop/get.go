package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/onehop/onehop/internal/client"
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
			w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
			defer w.Flush()
			return l.print(c, output, w)
		},
	}
	addOutputFlag(get.Flags(), &output)
	return get
}
