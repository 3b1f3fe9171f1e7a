package main

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/onehop/onehop/internal/intent"
)

func statsCmd() *cobra.Command {
	var node string
	var output outputFormat
	stats := &cobra.Command{
		Use: "stats [--node HOST] [-o json]", Short: "Per-host datapath state: mapping table, ARP engine, vifs, drops by reason", Args: cobra.NoArgs,
		Long: `Per host, as its agent last reported (every few seconds): its VMs and vifs,
the mapping table's use (remote VMs it holds a host for, out of its fixed size),
what the ARP engine did (questions unicast to the last known host and multicast
to a farm/subnet, addresses resolved or not, packets held while resolving), and
the datapath's counters: every drop by reason and every forwarding path, and
what each VM was refused for going over its share of what all tenants on the
host share (new flows, mapping placeholders, frames for the agent, DHCP),
and each sliver's packets and bytes in and out and its drops by reason
(port-space: frames from ports, ids, addresses not its own), and each TAP
policy's copies (made on a sender's host, delivered on the monitor's) and
copies dropped. docs/virtual-router.md, docs/port-space.md and docs/tap.md
say what each counter means.`,
		Example: "  onehop stats\n  onehop stats --node h1\n  onehop stats -o json",
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := api()
			if err != nil {
				return err
			}
			var sts []intent.AgentStatus
			if err := c.Do("GET", "/v1/status", nil, &sts); err != nil {
				return err
			}
			var shown []intent.AgentStatus
			for _, st := range sts {
				if node == "" || st.Node == node {
					shown = append(shown, st)
				}
			}
			if len(shown) == 0 {
				return fmt.Errorf("no agent has reported%s", map[bool]string{true: " for node " + node, false: ""}[node != ""])
			}
			if output == jsonOutput {
				return printJSON(cmd.OutOrStdout(), shown)
			}
			for _, st := range shown {
				printAgentStatus(cmd.OutOrStdout(), st)
			}
			return nil
		},
	}
	stats.Flags().StringVar(&node, "node", "", "only this host")
	addOutputFlag(stats.Flags(), &output)
	return stats
}

type counter struct {
	k string
	v uint64
}

func sortedCounters(m map[string]uint64) []counter {
	var out []counter
	for k, v := range m {
		if v > 0 {
			out = append(out, counter{k, v})
		}
	}
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j].k < out[i].k {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}

// printAgentStatus writes one agent's report: what `onehop stats` shows per host.
func printAgentStatus(w io.Writer, st intent.AgentStatus) {
	fmt.Fprintf(w, "%s: %d local VMs, vifs %v, applied %s at %s\n", st.Node, st.Endpoints, st.AttachedVifs, st.AppliedDigest, st.Time.Format("15:04:05"))
	if st.Error != "" {
		fmt.Fprintf(w, "  error: %s\n", st.Error)
	}
	if st.Version != nil {
		fmt.Fprintf(w, "  agent: %s\n", st.Version)
	}
	// The vifs by kind (how the datapath delivers to each guest).
	byKind := map[string][]string{}
	for name, kind := range st.VifKinds {
		byKind[kind] = append(byKind[kind], name)
	}
	for _, kind := range slices.Sorted(maps.Keys(byKind)) {
		slices.Sort(byKind[kind])
		fmt.Fprintf(w, "  %s vifs: %s\n", kind, strings.Join(byKind[kind], " "))
	}
	for _, name := range slices.Sorted(maps.Keys(st.RefusedVifs)) {
		fmt.Fprintf(w, "  vif %s refused: %s\n", name, st.RefusedVifs[name])
	}
	if a := st.ARP; a != nil {
		fmt.Fprintf(w, "  mapping table: %d remote VMs mapped, %d being asked, of %d entries\n", a.Mapped, a.Asking, a.Capacity)
		fmt.Fprintf(w, "  ARP engine: VMs' questions to the fabric %d (datapath), answered for other hosts %d, answers learned %d\n",
			st.Forwards["arp_to_fabric"], st.Forwards["arp_answered"], st.Forwards["arp_learned"])
		fmt.Fprintf(w, "              agent asked %d unicast + %d multicast: resolved %d, unresolved %d; refreshed %d, expired %d, lost %d, purged %d\n",
			a.UnicastRequests, a.MulticastRequests, a.Resolved, a.Unresolved, a.Refreshed, a.Expired, a.Lost, a.Purged)
		fmt.Fprintf(w, "  held packets: %d held, %d released, %d discarded; %d VMs announced\n", a.Held, a.Released, a.Discarded, a.Announced)
	}
	for _, kv := range sortedCounters(st.Drops) {
		fmt.Fprintf(w, "  dropped %-20s %d\n", kv.k, kv.v)
	}
	for _, kv := range sortedCounters(st.Forwards) {
		fmt.Fprintf(w, "  forwarded %-18s %d\n", kv.k, kv.v)
	}
	for _, r := range st.Refused {
		fmt.Fprintf(w, "  refused %-20s %-6s %d (over its share)\n", r.VM, r.What, r.Count)
	}
	printSliverStats(w, st.Slivers)
	printTapStats(w, st.Taps)
	printEgressStats(w, st.Egress)
}

// printEgressStats writes each egress VM's slice use and what it was
// refused (docs/north-south.md), by name; a VM with published ports only
// has its traffic through them.
func printEgressStats(w io.Writer, es []intent.EgressStats) {
	for _, s := range es {
		if s.Slice == "" && s.Floating == "" {
			fmt.Fprintf(w, "  egress %-20s published ports only: out %d packets %d bytes, in %d packets %d bytes\n",
				s.Name, s.PacketsOut, s.BytesOut, s.PacketsIn, s.BytesIn)
			continue
		}
		// A VM with a floating address leaves by it, not by its slice.
		by := "slice " + s.Slice
		if s.Floating != "" {
			by = "floating " + s.Floating
		}
		fmt.Fprintf(w, "  egress %-20s %s: %d of %d ports live, %d flows opened, %d refused (slice full), %d not allowed; out %d packets %d bytes, in %d packets %d bytes\n",
			s.Name, by, s.Live, s.Ports, s.Flows, s.Refused, s.NotAllowed, s.PacketsOut, s.BytesOut, s.PacketsIn, s.BytesIn)
	}
}

// printSliverStats writes each sliver's traffic and its drops by reason (the
// port-space datapath's counters), by name.
func printSliverStats(w io.Writer, ss []intent.SliverStats) {
	ss = slices.Clone(ss)
	slices.SortFunc(ss, func(a, b intent.SliverStats) int { return strings.Compare(a.Name, b.Name) })
	for _, s := range ss {
		fmt.Fprintf(w, "  sliver %-12s in %d packets %d bytes, out %d packets %d bytes\n", s.Name, s.PacketsIn, s.BytesIn, s.PacketsOut, s.BytesOut)
		for _, kv := range sortedCounters(s.Drops) {
			fmt.Fprintf(w, "    dropped %-18s %d\n", kv.k, kv.v)
		}
	}
}
