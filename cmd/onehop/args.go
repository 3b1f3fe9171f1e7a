package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
)

// strictArgs makes every command of the tree under root refuse what it does
// not know, so that a typo fails with a non-zero exit instead of printing
// help and succeeding (cobra checks unknown subcommands only at the root; a
// command with subcommands and no Run prints its help for any argument).
//
//   - A command with subcommands refuses any argument that is none of them,
//     naming it and suggesting the nearest; with no argument it prints its
//     help, as before.
//   - A leaf refuses an argument beyond what its Args accept, naming it; a
//     leaf that declares no Args takes none.
//   - `help TOPIC` refuses a topic that is no command.
//
// It runs once the tree is complete, cobra's help and completion commands
// included.
func strictArgs(root *cobra.Command) {
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	// A command with subcommands is runnable now (to refuse arguments);
	// its usage still shows only "CMD [command]", as for any group.
	root.SetUsageTemplate(strings.Replace(root.UsageTemplate(),
		"{{if .Runnable}}", "{{if and .Runnable (not .HasAvailableSubCommands)}}", 1))
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		switch {
		case c.Name() == "help" && c.Parent() == root:
			c.Args = knownTopic
		case c.HasSubCommands():
			if !c.Runnable() {
				c.SuggestionsMinimumDistance = 2 // what cobra uses at the root
				c.Args = knownSubcommand
				c.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
			}
		default:
			if c.Args == nil {
				c.Args = cobra.NoArgs
			}
			c.Args = nameExtra(c.Args)
		}
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(root)
}

// knownSubcommand is the Args of a command with subcommands and no action of
// its own: any argument is a subcommand it does not have.
func knownSubcommand(c *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	return unknownCommand(c, args[0])
}

func unknownCommand(c *cobra.Command, arg string) error {
	msg := fmt.Sprintf("unknown command %q for %q", arg, c.CommandPath())
	if s := c.SuggestionsFor(arg); len(s) > 0 {
		msg += fmt.Sprintf("; did you mean %q?", s[0])
	}
	return fmt.Errorf("%s (`%s --help` lists its commands)", msg, c.CommandPath())
}

// knownTopic is the Args of `help`: every topic must be a command.
func knownTopic(c *cobra.Command, args []string) error {
	found, rest, err := c.Root().Find(args)
	if err != nil {
		return err
	}
	if len(rest) > 0 && found.HasSubCommands() {
		return fmt.Errorf("unknown help topic: %w", unknownCommand(found, rest[0]))
	}
	if len(rest) > 0 {
		return fmt.Errorf("unknown help topic: %q has no subcommand %q", found.CommandPath(), rest[0])
	}
	return nil
}

// nameExtra wraps a leaf's Args so that too many arguments fail naming the
// first one too many (cobra's own message only counts them). Other refusals
// (too few) pass through as they are.
func nameExtra(valid cobra.PositionalArgs) cobra.PositionalArgs {
	return func(c *cobra.Command, args []string) error {
		err := valid(c, args)
		if err == nil {
			return nil
		}
		for k := len(args) - 1; k >= 0; k-- {
			if valid(c, args[:k]) == nil {
				return fmt.Errorf("unexpected argument %q for %q (usage: %s)", args[k], c.CommandPath(), c.UseLine())
			}
		}
		return err
	}
}
