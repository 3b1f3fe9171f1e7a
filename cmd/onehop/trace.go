package main

import (
	"fmt"
	"net/url"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/onehop/onehop/internal/trace"
)

func traceCmd() *cobra.Command {
	var req trace.Request
	var output outputFormat
	c := &cobra.Command{
		Use:   "trace FROM TO [--proto tcp|udp|icmp] [--sport N] [--dport N] [--flags S] [-o json]",
		Short: "What the datapath would do with one packet from FROM to TO, changing nothing",
		Long: `Runs the real datapath programs on a packet crafted from FROM to TO, against
the live maps of the hosts on its path, and shows each step: anti-spoofing,
the visibility rule (by farm and id, as 'onehop rule list' shows it) or the
firewall rule (by id, as 'onehop firewall list' shows it) that decided,
conntrack, the one hop to the holding host (its uplink MAC), that host's
uplink program, and the interface the packet would be delivered into — or
the drop reason, the very onehop_dropped_packets_total reason a real packet
would count. When the sending host's mapping table does not know where TO
lives yet, it says the packet would be held while the agent asks (the trace
asks nothing).

A trace changes nothing on any host: no conntrack entry, no counter, no
share spent, no mapping learned, no copy sent. Each host's agent runs a
second instance of its programs whose every write is compiled out, on the
same maps (docs/troubleshooting.md).

FROM is a VM (farm/subnet/vm, or its address), a sliver (host/sliver:
port space's program on its link, from its host's address), or an external
address (outside the tenant space and the hosts: the frame arrives on the
uplink of TO's host). TO is a VM, a sliver (its host's address; --dport
says which port it is steered by), or any IPv4 address (one no VM holds
is traced as the sending host sees it; a host's address to trace a reply
to a VM's egress flow or a sliver). A tenant traces between its own farm's
VMs, and from an external to them; slivers and hosts are an
administrator's.

TCP (the default) and UDP need --dport; a TCP packet is a SYN unless
--flags says otherwise (letters of FSRPAU: --flags A for a packet of an
established connection). ICMP is an echo request. --src-ip forges the
source address, to see anti-spoofing refuse it.`,
		Example: `  onehop trace blue/web/web1 blue/db/db1 --dport 5432
  onehop trace blue/web/web1 10.1.2.2 --proto icmp
  onehop trace 10.1.1.2 blue/web/web2 --proto udp --dport 53 -o json
  onehop trace blue/web/web1 blue/web/web2 --dport 80 --src-ip 10.1.1.99
  onehop trace h1/s1 203.0.113.7 --sport 10001 --dport 443
  onehop trace 203.0.113.7 h1/s1 --sport 443 --dport 10001`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			req.From, req.To = args[0], args[1]
			n, err := req.Normalize()
			if err != nil {
				return err
			}
			q := url.Values{"from": {n.From}, "to": {n.To}, "proto": {n.Proto}}
			if n.Proto != "icmp" {
				q.Set("sport", strconv.Itoa(int(n.Sport)))
				q.Set("dport", strconv.Itoa(int(n.Dport)))
			}
			if n.Flags != "" {
				q.Set("flags", n.Flags)
			}
			if n.SrcIP != "" {
				q.Set("src-ip", n.SrcIP)
			}
			cl, err := api()
			if err != nil {
				return err
			}
			var rep trace.Report
			if err := cl.Do("GET", "/v1/trace?"+q.Encode(), nil, &rep); err != nil {
				return err
			}
			if output == jsonOutput {
				return printJSON(cmd.OutOrStdout(), rep)
			}
			w := cmd.OutOrStdout()
			desc := n.Proto
			if n.Proto != "icmp" {
				desc = fmt.Sprintf("%s %d -> %d", n.Proto, n.Sport, n.Dport)
				if n.Flags != "" {
					desc += " [" + n.Flags + "]"
				}
			}
			fmt.Fprintf(w, "trace %s (%s) -> %s (%s), %s\n", endName(rep.From), rep.From.IP, endName(rep.To), rep.To.IP, desc)
			for i, h := range rep.Hops {
				for j, s := range h.Steps {
					if j == 0 {
						fmt.Fprintf(w, "%d. %s\n", i+1, s)
						continue
					}
					fmt.Fprintf(w, "   %s\n", s)
				}
			}
			verdict := rep.Verdict
			if rep.Drop != "" {
				verdict += fmt.Sprintf(" on %s: %s", rep.DropHost, rep.Drop)
			}
			_, err = fmt.Fprintf(w, "verdict: %s\n", verdict)
			return err
		},
	}
	f := c.Flags()
	f.StringVar(&req.Proto, "proto", "tcp", "tcp, udp or icmp (an echo request)")
	f.Uint16Var(&req.Sport, "sport", 0, "source port (tcp, udp; default 40000)")
	f.Uint16Var(&req.Dport, "dport", 0, "destination port (tcp, udp: required)")
	f.StringVar(&req.Flags, "flags", "", "TCP flags, letters of FSRPAU (default S, a SYN)")
	f.StringVar(&req.SrcIP, "src-ip", "", "the source address the packet claims (default FROM's own): what anti-spoofing does with a forged one")
	addOutputFlag(f, &output)
	return c
}

func endName(e trace.Endpoint) string {
	if e.Name != "" {
		return e.Name
	}
	if e.Kind != "" {
		return e.Kind
	}
	return "address"
}
