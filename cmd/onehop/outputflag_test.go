package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// noOutputFlag are the runnable commands without -o, each with why: they
// print nothing to stdout to make machine-readable, or what they print
// is not theirs (another program's output, a script, a stream of logs).
// Every other runnable command prints something and must take -o json.
var noOutputFlag = map[string]string{
	// Daemons: they log (--log-format json), they print no result.
	"onehop controller":  "daemon: logs only",
	"onehop agent":       "daemon: logs only",
	"onehop gateway run": "daemon: logs only",
	"onehop xtr run":     "daemon: logs only",
	"onehop vnat run":    "daemon: logs only",
	// Another program's output, as it is.
	"onehop lab exec":   "runs a command in a node: its output is the command's",
	"onehop netns-exec": "runs a command in a namespace: its output is the command's",
	// The lab's verbs report progress on stderr and print nothing to
	// stdout; `onehop lab status -o json` is the lab's state.
	"onehop lab up":          "progress on stderr only",
	"onehop lab down":        "progress on stderr only",
	"onehop lab add-host":    "progress on stderr only",
	"onehop lab remove-host": "progress on stderr only",
	"onehop lab restart":     "progress on stderr only",
	"onehop lab move":        "progress on stderr only",
	"onehop lab readdress":   "progress on stderr only",
	"onehop lab link":        "progress on stderr only",
	// cobra's own: a shell script, and help text.
	"onehop completion bash":       "a shell script",
	"onehop completion zsh":        "a shell script",
	"onehop completion fish":       "a shell script",
	"onehop completion powershell": "a shell script",
	"onehop help":                  "help text",
	// A capture file: pcap to -w FILE, or to stdout with -w - for a
	// pipe into tshark; its progress and count go to stderr.
	"onehop tap capture": "writes pcap (to stdout only with -w -), progress on stderr",
	// A build step (make man): it writes files and prints nothing.
	"onehop man": "writes man pages into DIR, prints nothing",
}

// Every runnable command that prints output takes -o json; a new one
// without it fails here until it has one or an entry above says why not.
func TestEveryCommandThatPrintsTakesOutputJSON(t *testing.T) {
	root := newRootCmd()
	seen := map[string]bool{}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, s := range c.Commands() {
			walk(s)
		}
		// A group runs only to print its help or refuse an argument
		// (strictArgs): its subcommands are the ones that act.
		if !c.Runnable() || c.HasSubCommands() {
			return
		}
		path := c.CommandPath()
		seen[path] = true
		f := c.Flags().Lookup("output")
		_, exempt := noOutputFlag[path]
		switch {
		case f == nil && !exempt:
			t.Errorf("%s prints output but has no -o json (add one, or say in noOutputFlag why it needs none)", path)
		case f != nil && exempt:
			t.Errorf("%s has -o but is listed in noOutputFlag: drop it from the list", path)
		case f != nil && (f.Shorthand != "o" || f.Value.Type() != "text|json"):
			t.Errorf("%s: --output is -%s of type %s, want -o text|json (addOutputFlag)", path, f.Shorthand, f.Value.Type())
		}
	}
	walk(root)
	for path := range noOutputFlag {
		if !seen[path] {
			t.Errorf("noOutputFlag names %s, which is no runnable command", path)
		}
	}
}

// A verb that changes intent answers -o json with the controller's own
// objects: the object a create returned, and for a delete (204, no body)
// what was deleted; its text line does not get in the way.
func TestVerbsThatChangeIntentPrintTheControllersAnswersAsJSON(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method + " " + r.URL.Path {
		case "POST /v1/farms":
			w.Header().Set("Content-Type", "application/json")
			w.Write([]byte(`{"name":"blue","id":3,"proxyARP":false}`))
		case "DELETE /v1/taps/t1":
			w.WriteHeader(http.StatusNoContent)
		case "GET /v1/plan":
			w.Write([]byte(`{"plan":"10.0.0.0/8:8/8/8"}`))
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	for _, tc := range []struct {
		args []string
		want map[string]any
	}{
		{[]string{"farm", "create", "blue"}, map[string]any{"name": "blue", "id": 3.0, "proxyARP": false}},
		{[]string{"tap", "delete", "t1"}, map[string]any{"method": "DELETE", "path": "/v1/taps/t1", "status": 204.0}},
	} {
		var out bytes.Buffer
		cmd := newRootCmd()
		cmd.SetArgs(append(tc.args, "--api", srv.URL, "-o", "json"))
		cmd.SetOut(&out)
		cmd.SetErr(&bytes.Buffer{})
		if err := cmd.Execute(); err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		var got map[string]any
		if err := json.Unmarshal(out.Bytes(), &got); err != nil {
			t.Fatalf("%v -o json printed %q, not one JSON object: %v", tc.args, out.String(), err)
		}
		if len(got) != len(tc.want) {
			t.Errorf("%v -o json: %v, want %v", tc.args, got, tc.want)
		}
		for k, v := range tc.want {
			if got[k] != v {
				t.Errorf("%v -o json: %s = %v, want %v", tc.args, k, got[k], v)
			}
		}
	}
	// Without -o json, the line for a person, and no JSON.
	var out bytes.Buffer
	cmd := newRootCmd()
	cmd.SetArgs([]string{"tap", "delete", "t1", "--api", srv.URL})
	cmd.SetOut(&out)
	if err := cmd.Execute(); err != nil || strings.TrimSpace(out.String()) != "tap t1 deleted" {
		t.Fatalf("tap delete: %q, %v", out.String(), err)
	}
}

func TestABadOutputFormatIsRefusedNamingTheFlag(t *testing.T) {
	err := run("status", "-o", "yaml")
	if err == nil || !strings.Contains(err.Error(), `invalid argument "yaml" for "-o, --output" flag: want text or json`) {
		t.Fatalf("status -o yaml: %v", err)
	}
}

// A command prints to its own writer (cobra's OutOrStdout), never around
// it to the process's stdout: what a caller sets is where it all goes.
func TestGetPrintsToTheCommandsWriter(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method+" "+r.URL.Path == "GET /v1/plan" {
			w.Write([]byte(`{"plan":"10.0.0.0/8:8/8/8"}`))
			return
		}
		if r.Method+" "+r.URL.Path != "GET /v1/farms" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`[{"name":"blue","id":3}]`))
	}))
	defer srv.Close()
	var out bytes.Buffer
	cmd := newRootCmd()
	cmd.SetArgs([]string{"get", "farms", "--api", srv.URL})
	cmd.SetOut(&out)
	if err := cmd.Execute(); err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(out.String()), "\n"); len(lines) != 2 || !strings.HasPrefix(lines[0], "FARM") || !strings.HasPrefix(lines[1], "blue") {
		t.Fatalf("get farms printed %q to its writer, want the header and blue", out.String())
	}
}
