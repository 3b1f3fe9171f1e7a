// Command onehop is the one binary of onehop: the controller, the per-host
// agent, the lab that emulates a data center on one machine, and the
// operator's verbs.
//
// Each noun has its own file holding its command (and, when `onehop get` can
// list it, its listing); nouns() below is the one place that registers them.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/onehop/onehop/internal/version"
)

// noun is one thing the CLI knows: its top-level command and what
// `onehop get` prints for it. Either may be nil.
type noun struct {
	cmd  func() *cobra.Command
	list *listing
}

// nouns registers every command and listing, one line per noun. A new feature
// adds its file and one line here.
func nouns() []noun {
	return []noun{
		{cmd: controllerCmd},
		{cmd: agentCmd},
		{cmd: pkiCmd},
		{cmd: labCmd},
		{cmd: netnsExecCmd},
		{cmd: farmCmd, list: &farmListing},
		{cmd: subnetCmd, list: &subnetListing},
		{cmd: vmCmd, list: &vmListing},
		{cmd: allowCmd, list: &ruleListing},
		{cmd: hostCmd, list: &hostListing},
		{cmd: peerCmd},
		{cmd: unpeerCmd},
		{cmd: ruleCmd},
		{cmd: firewallCmd},
		{cmd: sliverCmd, list: &sliverListing},
		{cmd: tapCmd, list: &tapListing},
		{cmd: floatingCmd, list: &floatingListing},
		{cmd: getCmd},
		{cmd: statsCmd},
		{cmd: statusCmd},
		{cmd: vnatCmd},
		{cmd: gatewayCmd},
		{cmd: lispCmd},
		{cmd: xtrCmd},
		{cmd: tenantCmd},
		{cmd: auditCmd},
		{cmd: planCmd},
		{cmd: observeCmd},
		{cmd: traceCmd},
		{cmd: versionCmd},
		{cmd: manCmd},
	}
}

func main() {
	if cniPlugin() {
		os.Exit(runCNI())
	}
	if err := newRootCmd().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "onehop:", err)
		os.Exit(1)
	}
}

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "onehop",
		Short: "Host-based network virtualization: one-hop routing between VMs, in the kernel",
		Long: `onehop gives tenants their own networks on a shared L2 fabric. Every host runs
an agent that programs eBPF on each VM's vif and on the host's uplink; a packet
goes straight from the sender's host to the receiver's host, with no
encapsulation. The controller keeps intent and allocations in etcd.

Try it on one machine (as root):
  onehop lab up examples/quickstart.yaml   build hosts and VMs in namespaces
  onehop lab exec web1 -- ping 10.1.1.3     talk between VMs across hosts
  onehop lab status                         what is where
  onehop lab down                           remove all of it`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       version.Get().String(),
	}
	root.SetVersionTemplate("{{.Version}}\n")
	root.PersistentFlags().StringVar(&apiAddr, "api", "", "controller REST API: a unix socket or https://HOST:PORT (default: the lab's socket)")
	addClientTLSFlags(root)
	for _, n := range nouns() {
		if n.cmd != nil {
			root.AddCommand(n.cmd())
		}
	}
	answerAsJSON(root)
	strictArgs(root)
	return root
}

func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
