package main

import (
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// Every command that has -o takes it through outputFormat: the same two
// choices everywhere, text by default, and a wrong value refused while the
// flags are parsed, naming the flag, before the command runs (it would
// otherwise dial the controller or a daemon first).
func TestEveryOutputFlagIsTheOneFormatFlag(t *testing.T) {
	var walk func(c *cobra.Command)
	seen := 0
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			walk(sub)
		}
		f := c.Flags().Lookup("output")
		if f == nil {
			return
		}
		seen++
		if _, ok := f.Value.(*outputFormat); !ok {
			t.Errorf("%s: -o is a %s, not the shared outputFormat", c.CommandPath(), f.Value.Type())
			return
		}
		if f.Shorthand != "o" || f.DefValue != "text" {
			t.Errorf("%s: -o is -%s with default %q, want -o text", c.CommandPath(), f.Shorthand, f.DefValue)
		}
	}
	walk(newRootCmd())
	if seen < 9 { // get, lab status, lisp map list, lisp server, sliver list, tap list and get, vnat and gateway status
		t.Fatalf("only %d commands have -o; the walk did not reach them", seen)
	}
	for _, args := range [][]string{
		{"get", "vms", "-o", "yaml"},
		{"lab", "status", "-o", "yaml"},
		{"vnat", "status", "-o", "yaml"},
		{"gateway", "status", "-o", "yaml"},
		{"lisp", "server", "-o", "yaml"},
		{"tap", "get", "x", "-o", "yaml"},
	} {
		_, err := runOut(args...)
		if err == nil || !strings.Contains(err.Error(), `invalid argument "yaml" for "-o, --output" flag: want text or json`) {
			t.Errorf("onehop %s: err %v, want -o refused by name", strings.Join(args, " "), err)
		}
	}
}
