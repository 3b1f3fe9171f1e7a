package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"

	"github.com/spf13/cobra"
)

// apiVerbs are the verbs that change intent through the controller's REST
// API. Their -o json prints what the controller answered (the API's own
// objects), written once here rather than in every noun's file: the
// answer to each change asked (POST, PUT, DELETE), one object, or a list
// when a verb asked several. An answer with no body (a delete's 204) is
// {"method", "path", "status"}.
var apiVerbs = []string{
	"farm create", "farm delete", "subnet create", "subnet delete", "vm create", "vm delete", "vm move",
	"host add", "host remove", "allow", "peer", "unpeer", "rule delete", "firewall add", "firewall delete",
	"sliver create", "sliver delete", "sliver set", "tap create", "tap delete",
	"lisp map add", "lisp map delete", "tenant token revoke", "tenant cert revoke",
	"floating create", "floating delete", "floating attach", "floating detach",
}

// answerAsJSON gives each of apiVerbs under root its -o (a verb that has
// one of its own keeps it).
func answerAsJSON(root *cobra.Command) {
	for _, path := range apiVerbs {
		c, rest, err := root.Find(strings.Fields(path))
		if err != nil || len(rest) > 0 || c.RunE == nil {
			panic(fmt.Sprintf("apiVerbs: %q is no command of the tree", path))
		}
		if c.Flags().Lookup("output") == nil {
			wrapAnswers(c)
		}
	}
}

func wrapAnswers(c *cobra.Command) {
	var output outputFormat
	addOutputFlag(c.Flags(), &output)
	run := c.RunE
	c.RunE = func(cmd *cobra.Command, args []string) error {
		if output != jsonOutput {
			return run(cmd, args)
		}
		out := cmd.OutOrStdout()
		answers.start()
		defer answers.stop()
		// The verb's own lines (every command prints to its
		// OutOrStdout) give way to the JSON.
		cmd.SetOut(io.Discard)
		err := run(cmd, args)
		cmd.SetOut(out)
		if err != nil {
			return err
		}
		return printJSON(out, answers.result())
	}
}

// apiAnswer is one successful answer of the controller.
type apiAnswer struct {
	method, path string
	status       int
	body         []byte
}

// answerLog holds the answers while a verb runs with -o json.
type answerLog struct {
	mu  sync.Mutex
	on  bool
	got []apiAnswer
}

// answers is the CLI's one log: api() hands every client's answers to it.
var answers answerLog

func (l *answerLog) start() {
	l.mu.Lock()
	l.on, l.got = true, nil
	l.mu.Unlock()
}

func (l *answerLog) stop() {
	l.mu.Lock()
	l.on, l.got = false, nil
	l.mu.Unlock()
}

// record is a client's OnAnswer.
func (l *answerLog) record(method, path string, status int, body []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.on {
		l.got = append(l.got, apiAnswer{method, path, status, append([]byte(nil), body...)})
	}
}

// result is what -o json prints: the answers to changes (the reads a verb
// made first are not what it did), or the reads when it changed nothing.
func (l *answerLog) result() any {
	l.mu.Lock()
	defer l.mu.Unlock()
	var changes, reads []any
	for _, a := range l.got {
		var v any = json.RawMessage(a.body)
		if len(strings.TrimSpace(string(a.body))) == 0 {
			v = map[string]any{"method": a.method, "path": a.path, "status": a.status}
		}
		if a.method == "GET" {
			reads = append(reads, v)
		} else {
			changes = append(changes, v)
		}
	}
	if len(changes) == 0 {
		changes = reads
	}
	switch len(changes) {
	case 0:
		return []any{}
	case 1:
		return changes[0]
	}
	return changes
}
