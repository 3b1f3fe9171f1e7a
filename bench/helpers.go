package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"
)

// helperModes are the programs the bench binary also is, by first
// argument: `BENCH rrperf ...` (rrperf.go), `BENCH vnatends ...`
// (vnatends.go), `BENCH taprelay ...` (taprelay.go). Re-executing itself
// keeps each in its own process: a tool inside a namespace, or code that
// must not run in the bench's own.
var helperModes = map[string]func(args []string) int{
	rrperfArg:   rrperfMain,
	vnatEndsArg: vnatEndsMain,
	tapRelayArg: tapRelayMain,
}

// helperArgv is the command line that runs helper mode with args: the
// bench's own binary, re-executed.
func helperArgv(mode string, args ...string) ([]string, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("the bench's own binary (for %s): %w", mode, err)
	}
	return append([]string{self, mode}, args...), nil
}

// helperProc is a long-lived helper that talks in lines: it prints "ready"
// once it is set up, then answers commands on its stdin (each helper its
// own) until "quit" or the end of its input.
type helperProc struct {
	cmd    *exec.Cmd
	in     io.WriteCloser
	lines  *bufio.Scanner
	stderr *strings.Builder
	done   chan struct{}
}

// startHelper starts helper mode with args and waits until it is ready;
// cleanup tells it to quit.
func startHelper(ctx context.Context, e *Env, mode string, args ...string) (*helperProc, error) {
	argv, err := helperArgv(mode, args...)
	if err != nil {
		return nil, err
	}
	h := &helperProc{cmd: command(context.Background(), argv...), stderr: &strings.Builder{}, done: make(chan struct{})}
	h.cmd.Stderr = h.stderr
	if h.in, err = h.cmd.StdinPipe(); err != nil {
		return nil, err
	}
	stdout, err := h.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := h.cmd.Start(); err != nil {
		return nil, err
	}
	h.lines = bufio.NewScanner(stdout)
	h.lines.Buffer(make([]byte, 64<<10), 1<<20)
	e.OnCleanup(h.stop)
	line, err := h.readLine(ctx, 2*time.Minute)
	if err != nil || line != "ready" {
		h.stop() //nolint:errcheck // reporting the first failure
		return nil, fmt.Errorf("%s %s: %q %v: %s", mode, strings.Join(args, " "), line, err, h.stderr.String())
	}
	return h, nil
}

func (h *helperProc) readLine(ctx context.Context, timeout time.Duration) (string, error) {
	got := make(chan bool, 1)
	go func() { got <- h.lines.Scan() }()
	select {
	case ok := <-got:
		if !ok {
			return "", fmt.Errorf("the helper ended: %v", h.lines.Err())
		}
		return h.lines.Text(), nil
	case <-ctx.Done():
		return "", context.Cause(ctx)
	case <-time.After(timeout):
		return "", fmt.Errorf("no answer in %v", timeout)
	}
}

// stop tells the helper to quit and waits.
func (h *helperProc) stop() error {
	select {
	case <-h.done:
		return nil
	default:
	}
	defer close(h.done)
	fmt.Fprintln(h.in, "quit") //nolint:errcheck // it may be gone already
	h.in.Close()
	exited := make(chan error, 1)
	go func() { exited <- h.cmd.Wait() }()
	select {
	case err := <-exited:
		return err
	case <-time.After(10 * time.Second):
		h.cmd.Process.Kill() //nolint:errcheck // stuck
		return fmt.Errorf("%s: killed after 10 s", strings.Join(h.cmd.Args[1:], " "))
	}
}
