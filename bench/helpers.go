package main

import (
	"fmt"
	"os"
)

// helperModes are the programs the bench binary also is, by first
// argument: `BENCH rrperf ...` (rrperf.go), `BENCH vnatends ...`
// (vnatends.go). Re-executing itself keeps each in its own process: a tool
// inside a namespace, or code that must not run in the bench's own.
var helperModes = map[string]func(args []string) int{
	rrperfArg:   rrperfMain,
	vnatEndsArg: vnatEndsMain,
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
