package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// run executes the CLI in-process and returns its error.
func run(args ...string) error {
	cmd := newRootCmd()
	cmd.SetArgs(args)
	cmd.SetOut(&bytes.Buffer{})
	cmd.SetErr(&bytes.Buffer{})
	return cmd.Execute()
}

func TestBadInvocationsSayWhatIsWrong(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("hosts:\n  - name: h1\nvms:\n  - {name: v1, host: h2, subnet: a/b}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := t.TempDir()
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"agent"}, "--node is required"},
		{[]string{"agent", "--node", "h1"}, "--etcd-endpoints is required"},
		{[]string{"controller"}, "--data-dir is required"},
		{[]string{"lab", "up"}, "accepts 1 arg"},
		{[]string{"lab", "up", bad}, `bad.yaml:4: vm "v1": host "h2" is not defined`},
		{[]string{"lab", "up", filepath.Join(empty, "nope.yaml")}, "read topology"},
		{[]string{"lab", "status", "--root", empty}, "no lab is up"},
		{[]string{"lab", "down", "--root", empty, "--lab", "x"}, `no lab named "x" is up`},
		{[]string{"lab", "exec", "--root", empty, "web1"}, "requires at least 2 arg"},
		{[]string{"agent", "--resync", "soon"}, `invalid argument "soon"`},
	}
	for _, c := range cases {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			err := run(c.args...)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want it to contain %q", err, c.want)
			}
		})
	}
}

func TestHelpTeachesTheLab(t *testing.T) {
	cmd := newRootCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"lab", "exec", "--help"})
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "onehop lab exec web1 -- ping") {
		t.Fatalf("lab exec --help has no example:\n%s", out.String())
	}
}

// cliStep is one CLI call against a test controller: what it is run with,
// and what it must print (or, when fail, what its error must say).
type cliStep struct {
	args []string
	want string // in the output, or in the error when fail
	fail bool
}

// runSteps runs steps in order against the API at addr, stopping at the
// first that does not do what it says.
func runSteps(t *testing.T, addr string, steps []cliStep) {
	t.Helper()
	for _, st := range steps {
		out, err := runOut(append(st.args, "--api", addr)...)
		switch {
		case !st.fail && err != nil:
			t.Fatalf("%v: %v", st.args, err)
		case !st.fail && !strings.Contains(out, st.want):
			t.Fatalf("%v: printed %q, want it to contain %q", st.args, out, st.want)
		case st.fail && (err == nil || !strings.Contains(err.Error(), st.want)):
			t.Fatalf("%v: err = %v, want %q", st.args, err, st.want)
		}
	}
}
