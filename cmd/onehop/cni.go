package main

import (
	"context"
	"os"
	"time"

	"github.com/onehop/onehop/internal/cni"
	"github.com/onehop/onehop/internal/cnilink"
)

// cniPlugin reports whether the binary was run as a CNI plugin: a runtime
// runs a plugin with CNI_COMMAND set and no arguments (the binary
// installed as /opt/cni/bin/onehop, or a link to it). An operator's
// `onehop ...` always has arguments, so a stray CNI_COMMAND in a shell
// does not turn the CLI into the plugin.
func cniPlugin() bool { return os.Getenv("CNI_COMMAND") != "" && len(os.Args) == 1 }

// runCNI runs the CNI command and returns the exit status. No command may
// hang a runtime: the whole of it is bounded (ADD's own wait for the
// agent is bounded tighter, by attachTimeout).
func runCNI() int {
	ctx, cancel := context.WithTimeout(context.Background(), cni.MaxAttachTimeout+time.Minute)
	defer cancel()
	p := &cni.Plugin{NewController: cni.NewAPI, Links: cnilink.Links{}, Hostname: os.Hostname}
	return p.Run(ctx, os.Getenv, os.Stdin, os.Stdout)
}
