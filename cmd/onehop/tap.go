package main

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"slices"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/onehop/onehop/internal/client"
	"github.com/onehop/onehop/internal/controller"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/tappolicy"
)

const tapLong = `A virtual TAP copies traffic to a monitor VM, on any host, for tcpdump,
tshark or an IDS running in it: no SPAN port, no tunnel. A policy names a
sender, a receiver and a monitor: every packet the sender sends the receiver
that passes the filters is delivered to the receiver exactly as before, and
a copy of it (the same bytes: addresses, ports, payload) goes to the
monitor. The copy is made on the sender's host after the packet's own path
is decided, so production traffic never waits for it; when the monitor
cannot keep up, copies are dropped and counted (onehop stats), never the
production packet.

One direction: sender -> receiver, as in the paper. --both-directions adds
the reverse (receiver -> sender, with --sport and --dport swapped: the
replies) as a second rule of the same policy.

Sender and receiver (REF):
  blue/web/web1        one VM
  10.1.1.2             the same VM by its address
  02:00:0a:01:01:02    the same VM by its MAC
  blue/web             every VM of a subnet
  any                  any VM of the monitor's farm
An address or MAC is resolved to its VM when the policy is created, and the
policy follows the VM when it moves.

Instead of a monitor VM, --collector ADDR sends the copies to a machine on the
fabric (an IDS, a packet broker, tshark), wrapped as --encap: erspan2 (GRE +
ERSPAN type II, the policy's id as session; the default), erspan3 (ERSPAN
type III, with a timestamp) or gre (plain GRE carrying the Ethernet frame),
from the sender's host's uplink address. With a collector, any is any VM of
the other end's farm. onehop tap capture writes a policy's copies to a pcap
file, without a monitor VM.

The monitor is one VM (blue/ops/mon, or its address or MAC). It sees only
its own farm's traffic: a sender or receiver in another farm is refused
unless the policy says --cross-farm and that farm and the monitor's peer
with each other (onehop peer, both ways). "any" stays the monitor's farm.

Filters, each optional (left out: any):
  --proto tcp|udp|icmp|N   IP protocol
  --sport N[-M]            source ports, 1-65535 (tcp, udp or any proto)
  --dport N[-M]            destination ports
  --vlan N                 the sender's segment: onehop networks are subnets,
                           so N = farm id * 256 + subnet id (blue/web with
                           ids 1 and 1 is 257)`

func tapCmd() *cobra.Command {
	tp := &cobra.Command{Use: "tap", Short: "Virtual TAP: copy a sender's traffic to a receiver to a monitor VM", Long: tapLong,
		Example: `  onehop tap create web-http --sender blue/web/web1 --receiver blue/db/db1 --monitor blue/ops/mon --proto tcp --dport 80
  onehop tap create all-web --sender blue/web --receiver any --monitor blue/ops/mon --both-directions
  onehop tap list
  onehop tap get web-http
  onehop tap delete web-http
  onehop tap create web-span --sender blue/web --receiver any --collector 192.168.50.200 --encap erspan2
  onehop tap capture web-http -w /tmp/web.pcap --count 100`}
	tp.AddCommand(tapCreateCmd(), tapListCmd(), tapGetCmd(), tapDeleteCmd(), tapCaptureCmd())
	return tp
}

func tapCreateCmd() *cobra.Command {
	var s tappolicy.Spec
	cmd := &cobra.Command{
		Use:   "create NAME --sender REF --receiver REF (--monitor VM | --collector ADDR [--encap erspan2|erspan3|gre]) [--proto P] [--sport N[-M]] [--dport N[-M]] [--vlan N] [--both-directions] [--cross-farm]",
		Short: "Create a TAP policy: copies of what --sender sends --receiver go to --monitor or --collector", Args: cobra.ExactArgs(1),
		Long: tapLong,
		Example: `  # HTTP requests from web1 to db1 (one direction), to the monitor mon:
  onehop tap create web-http --sender blue/web/web1 --receiver blue/db/db1 --monitor blue/ops/mon --proto tcp --dport 80
  # the same, both ways (the replies have source port 80):
  onehop tap create web-http2 --sender 10.1.1.2 --receiver 10.1.2.2 --monitor 10.1.3.2 --proto tcp --dport 80 --both-directions
  # everything the web subnet sends, to anyone of its farm:
  onehop tap create all-web --sender blue/web --receiver any --monitor blue/ops/mon
  # DNS from a peer farm's VM (both farms peer):
  onehop tap create red-dns --sender red/app/app1 --receiver any --monitor blue/ops/mon --proto udp --dport 53 --cross-farm
  # the web subnet's HTTP, as ERSPAN to a collector on the fabric:
  onehop tap create web-span --sender blue/web --receiver any --proto tcp --dport 80 --collector 192.168.50.200`,
		RunE: func(cmd *cobra.Command, args []string) error {
			s.Name = args[0]
			p, err := tapArgs(s)
			if err != nil {
				return err
			}
			c, err := api()
			if err != nil {
				return err
			}
			var v controller.TapView
			if err := c.Do("POST", "/v1/taps", p, &v); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "tap %s: id %d, %s\n", v.Name, v.ID, describeTap(v))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&s.Sender, "sender", "", "who sends: farm/subnet/vm, farm/subnet, any, or a VM's IP or MAC")
	f.StringVar(&s.Receiver, "receiver", "", "who receives: the same forms")
	f.StringVar(&s.Monitor, "monitor", "", "the VM the copies go to: farm/subnet/vm, or its IP or MAC")
	f.StringVar(&s.Collector, "collector", "", "instead of --monitor: an IPv4 address on the fabric the copies are sent to, encapsulated")
	f.StringVar(&s.Encap, "encap", "", "with --collector: erspan2 (default), erspan3 or gre")
	f.StringVar(&s.Proto, "proto", "", "tcp, udp, icmp or an IP protocol number (default any)")
	f.StringVar(&s.Sport, "sport", "", "source port N or range N-M (default any)")
	f.StringVar(&s.Dport, "dport", "", "destination port N or range N-M (default any)")
	f.StringVar(&s.VLAN, "vlan", "", "the sender's segment, farm id * 256 + subnet id (default any)")
	f.BoolVar(&s.BothDirections, "both-directions", false, "also copy receiver -> sender (ports swapped)")
	f.BoolVar(&s.CrossFarm, "cross-farm", false, "allow a sender or receiver in another farm that peers with the monitor's")
	return cmd
}

// tapArgs checks a policy with the controller's own syntax checks and
// names the flag to fix before the controller is asked.
func tapArgs(s tappolicy.Spec) (intent.TapPolicy, error) {
	reqs := []struct{ flag, val, what string }{
		{"--sender", s.Sender, "who sends: farm/subnet/vm, farm/subnet, any, or a VM's IP or MAC"},
		{"--receiver", s.Receiver, "who receives: farm/subnet/vm, farm/subnet, any, or a VM's IP or MAC"},
	}
	if s.Collector == "" {
		reqs = append(reqs, struct{ flag, val, what string }{"--monitor", s.Monitor, "the VM the copies go to: farm/subnet/vm, or its IP or MAC (or --collector ADDR, a machine on the fabric)"})
	}
	for _, req := range reqs {
		if req.val == "" {
			return intent.TapPolicy{}, fmt.Errorf("%s is required: %s", req.flag, req.what)
		}
	}
	p, err := tappolicy.ParseSpec(s)
	var fe *tappolicy.FieldError
	if errors.As(err, &fe) {
		if fe.Field == "name" {
			return p, fmt.Errorf("NAME: %s", fe.Msg)
		}
		return p, fmt.Errorf("--%s: %s", fe.Field, fe.Msg)
	}
	return p, err
}

// describeTap is one policy in a line: who, to whom, what, where to.
func describeTap(v controller.TapView) string {
	dir := "->"
	if v.BothDirections {
		dir = "<->"
	}
	to := "monitor " + v.Monitor
	if v.Collector != "" {
		to = fmt.Sprintf("collector %s (%s)", v.Collector, v.Encap)
	}
	out := fmt.Sprintf("%s %s %s, %s, %s", v.Sender, dir, v.Receiver, v.Filter, to)
	if v.CrossFarm {
		out += " (cross-farm)"
	}
	return out
}

func tapListCmd() *cobra.Command {
	var output outputFormat
	cmd := &cobra.Command{
		Use: "list [-o json]", Short: "List TAP policies with their ids, ends and filters", Args: cobra.NoArgs,
		Example: "  onehop tap list\n  onehop tap list -o json",
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := api()
			if err != nil {
				return err
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			defer w.Flush()
			return printTaps(c, output, w)
		},
	}
	addOutputFlag(cmd.Flags(), &output)
	return cmd
}

func printTaps(c *client.Client, output outputFormat, w io.Writer) error {
	var items []controller.TapView
	if err := c.Do("GET", "/v1/taps", nil, &items); err != nil {
		return err
	}
	if output == jsonOutput {
		return printJSON(w, items)
	}
	fmt.Fprintln(w, "TAP\tID\tSENDER\tRECEIVER\tMONITOR\tFILTER\tDIRECTIONS")
	for _, v := range items {
		dirs := "one"
		if v.BothDirections {
			dirs = "both"
		}
		name := v.Name
		if v.Problem != "" {
			name += " (copies nothing)"
		}
		mon := v.Monitor
		if v.Collector != "" {
			mon = v.Collector + " (" + v.Encap + ")"
		}
		fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%s\t%s\t%s\n", name, v.ID, v.Sender, v.Receiver, mon, v.Filter, dirs)
	}
	for _, v := range items {
		if v.Problem != "" {
			fmt.Fprintf(w, "%s copies nothing: %s\n", v.Name, v.Problem)
		}
	}
	return nil
}

var tapListing = listing{kind: "taps", print: func(c *client.Client, output outputFormat, w io.Writer) error {
	return printTaps(c, output, w)
}}

func tapGetCmd() *cobra.Command {
	var output outputFormat
	cmd := &cobra.Command{
		Use: "get NAME [-o json]", Short: "Show one TAP policy", Args: cobra.ExactArgs(1),
		Example: "  onehop tap get web-http",
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := tappolicy.CheckName(args[0]); err != nil {
				return fmt.Errorf("NAME: %w", err)
			}
			c, err := api()
			if err != nil {
				return err
			}
			var v controller.TapView
			if err := c.Do("GET", "/v1/taps/"+args[0], nil, &v); err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if output == jsonOutput {
				return printJSON(out, v)
			}
			fmt.Fprintf(out, "tap %s: id %d, %s\n", v.Name, v.ID, describeTap(v))
			if v.Problem != "" {
				fmt.Fprintf(out, "copies nothing: %s\n", v.Problem)
			}
			return nil
		},
	}
	addOutputFlag(cmd.Flags(), &output)
	return cmd
}

func tapDeleteCmd() *cobra.Command {
	return &cobra.Command{
		Use: "delete NAME", Short: "Delete a TAP policy: no more copies, nothing left on any host", Args: cobra.ExactArgs(1),
		Example: "  onehop tap delete web-http",
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := tappolicy.CheckName(args[0]); err != nil {
				return fmt.Errorf("NAME: %w", err)
			}
			c, err := api()
			if err != nil {
				return err
			}
			if err := c.Do("DELETE", "/v1/taps/"+args[0], nil, nil); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "tap %s deleted\n", args[0])
			return nil
		},
	}
}

// printTapStats writes each TAP rule's copies on one host, by id (a
// two-way policy's reverse after its forward rules): at the sender's edge
// the copies made, at the monitor's the copies delivered, and the copies
// dropped (the monitor's share exceeded, a clone failed).
func printTapStats(w io.Writer, ts []intent.TapStats) {
	ts = slices.Clone(ts)
	slices.SortFunc(ts, func(a, b intent.TapStats) int { return cmp.Compare(a.ID, b.ID) })
	for _, t := range ts {
		name := t.Policy
		if t.ID&intent.TapReverse != 0 {
			name += " (reverse)"
		}
		fmt.Fprintf(w, "  tap %-20s copies %d packets %d bytes, dropped %d\n", name, t.Packets, t.Bytes, t.Dropped)
	}
}
