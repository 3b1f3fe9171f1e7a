package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// errReached replaces every leaf's action in TestEveryCommandRefusesWhatItDoesNotKnow:
// a refused invocation must never get that far, and the walk runs nothing.
var errReached = errors.New("the command's action ran")

// takesACommand are the leaves whose last arguments are a command to run
// (after --), so no number of arguments is too many.
var takesACommand = map[string]bool{
	"onehop lab exec":   true,
	"onehop netns-exec": true,
}

// execute runs args through a new command tree in-process (a tree keeps
// its flags' values between runs): its error, and what it printed. With
// stub, no leaf's action runs: each returns errReached instead.
func execute(stub bool, args ...string) (string, error) {
	root := newRootCmd()
	if stub {
		visit(root, func(c *cobra.Command) {
			if !c.HasSubCommands() {
				c.Run, c.RunE = nil, func(*cobra.Command, []string) error { return errReached }
			}
		})
	}
	var out bytes.Buffer
	root.SetArgs(args)
	root.SetOut(&out)
	root.SetErr(&out)
	err := root.Execute()
	return out.String(), err
}

// visit calls fn on c and every command under it.
func visit(c *cobra.Command, fn func(*cobra.Command)) {
	fn(c)
	for _, s := range c.Commands() {
		visit(s, fn)
	}
}

// placeholders returns n arguments nobody would type.
func placeholders(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = "zz-arg"
	}
	return out
}

func TestEveryCommandRefusesWhatItDoesNotKnow(t *testing.T) {
	var all []*cobra.Command
	visit(newRootCmd(), func(c *cobra.Command) { all = append(all, c) })
	groups := 0
	for _, c := range all {
		if c.HasSubCommands() {
			groups++
		}
		path := strings.Fields(c.CommandPath())[1:]
		t.Run(c.CommandPath(), func(t *testing.T) {
			// Control: the command is there, and its help exits 0.
			out, err := execute(true, append(path, "--help")...)
			if err != nil || !strings.Contains(out, "Usage:") || !strings.Contains(out, c.CommandPath()) {
				t.Fatalf("%s --help: err %v, output:\n%s", c.CommandPath(), err, out)
			}
			if c.HasSubCommands() {
				const typo = "zz-no-such-verb"
				_, err := execute(true, append(path, typo, "red")...)
				if err == nil || !strings.Contains(err.Error(), `"`+typo+`"`) || !strings.Contains(err.Error(), `"`+c.CommandPath()+`"`) {
					t.Fatalf("%s %s red: err = %v, want an error naming %q and %q", c.CommandPath(), typo, err, typo, c.CommandPath())
				}
				return
			}
			// A leaf: how many arguments it takes (the control: some
			// number passes), then one more must fail naming it.
			most := -1
			for n := 0; n <= 8; n++ {
				if c.ValidateArgs(placeholders(n)) == nil {
					most = n
				}
			}
			if most < 0 {
				t.Fatalf("%s accepts no number of arguments from 0 to 8", c.CommandPath())
			}
			if most == 8 {
				if !takesACommand[c.CommandPath()] {
					t.Fatalf("%s accepts any number of arguments; declare its Args (or list it in takesACommand if it runs a command)", c.CommandPath())
				}
				return
			}
			const extra = "zz-extra-arg"
			args := append(append(path, placeholders(most)...), extra)
			_, err = execute(true, args...)
			if errors.Is(err, errReached) {
				t.Fatalf("onehop %s: the action ran with an argument too many", strings.Join(args, " "))
			}
			if err == nil || !strings.Contains(err.Error(), `"`+extra+`"`) {
				t.Fatalf("onehop %s: err = %v, want an error naming %q", strings.Join(args, " "), err, extra)
			}
		})
	}
	if groups < 10 || len(all) < 50 {
		t.Fatalf("the walk saw %d commands, %d with subcommands: is the tree built?", len(all), groups)
	}
}

func TestTyposFailNamingWhatIsUnknown(t *testing.T) {
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"farm", "destroy", "red"}, `unknown command "destroy" for "onehop farm"`},
		{[]string{"farm", "creat", "red"}, `did you mean "create"?`},
		{[]string{"frm", "create", "red"}, `unknown command "frm" for "onehop"; did you mean "farm"?`},
		{[]string{"lisp", "map", "remove", "10.0.0.0/8"}, `unknown command "remove" for "onehop lisp map"`},
		{[]string{"lab", "up", "a.yaml", "b.yaml"}, `unexpected argument "b.yaml" for "onehop lab up"`},
		{[]string{"lab", "link", "wan1", "down", "now"}, `unexpected argument "now"`},
		{[]string{"help", "frm"}, `unknown help topic: unknown command "frm"`},
		{[]string{"help", "lab", "up", "now"}, `"onehop lab up" has no subcommand "now"`},
		{[]string{"completion", "zsh2"}, `unknown command "zsh2" for "onehop completion"`},
	}
	for _, c := range cases {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			_, err := execute(false, c.args...)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want it to contain %q", err, c.want)
			}
		})
	}
	// Controls: a group alone, and help of what exists, still print help
	// and succeed.
	for _, args := range [][]string{{"farm"}, {"help", "farm"}, {"help", "lab", "up"}, {"lisp", "map", "--help"}} {
		if out, err := execute(false, args...); err != nil || !strings.Contains(out, "Usage:") {
			t.Errorf("onehop %s: err %v, output:\n%s", strings.Join(args, " "), err, out)
		}
	}
	// A group's usage still shows only "CMD [command]".
	if out, _ := execute(false, "farm", "--help"); strings.Contains(out, "onehop farm [flags]") {
		t.Errorf("farm --help shows a usage line of its own:\n%s", out)
	}
}

// TestMain lets TestTypoExitsNonZero run this binary as the CLI itself.
func TestMain(m *testing.M) {
	if os.Getenv("ONEHOP_TEST_RUN_MAIN") == "1" {
		os.Args = append([]string{"onehop"}, strings.Fields(os.Getenv("ONEHOP_TEST_ARGS"))...)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestTypoExitsNonZero(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args string
		code int
	}{
		{"farm --help", 0}, // the control
		{"farm destroy red", 1},
	} {
		cmd := exec.Command(exe)
		cmd.Env = append(os.Environ(), "ONEHOP_TEST_RUN_MAIN=1", "ONEHOP_TEST_ARGS="+c.args)
		out, _ := cmd.CombinedOutput()
		if got := cmd.ProcessState.ExitCode(); got != c.code {
			t.Errorf("onehop %s: exit %d, want %d; output:\n%s", c.args, got, c.code, out)
		}
		if c.code != 0 && !strings.Contains(string(out), `"destroy"`) {
			t.Errorf("onehop %s: output does not name the unknown verb:\n%s", c.args, out)
		}
	}
}
