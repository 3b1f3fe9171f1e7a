package main

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/onehop/onehop/internal/client"
	"github.com/onehop/onehop/internal/controller"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/lab"
	"github.com/onehop/onehop/internal/policy"
)

// apiAddr is the --api flag: a unix socket or http://host:port.
var apiAddr string

func api() (*client.Client, error) {
	if apiAddr != "" {
		return apiClient(apiAddr)
	}
	name, err := lab.Resolve(lab.DefaultRoot, "")
	if err != nil {
		return nil, fmt.Errorf("no --api given and %w", err)
	}
	st, err := lab.Load(lab.DefaultRoot, name)
	if err != nil {
		return nil, err
	}
	if st.APISocket == "" {
		return nil, fmt.Errorf("lab %q has no controller API (datapath %s)", name, st.Datapath)
	}
	return client.New(st.APISocket), nil
}

// splitPath checks "a/b/c"-style names have n parts.
func splitPath(arg string, n int, shape string) ([]string, error) {
	parts := strings.Split(arg, "/")
	if len(parts) != n {
		return nil, fmt.Errorf("%q: want %s", arg, shape)
	}
	for _, p := range parts {
		if p == "" {
			return nil, fmt.Errorf("%q: want %s", arg, shape)
		}
	}
	return parts, nil
}

func printJSON(v any) error {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func verbCmds() []*cobra.Command {
	farm := &cobra.Command{Use: "farm", Short: "Tenant farms: each one its own network, 10.f.0.0/16"}
	var proxyARP bool
	farmCreate := &cobra.Command{
		Use: "create FARM [--proxy-arp]", Short: "Create a farm (its id is the f of 10.f.s.h)", Args: cobra.ExactArgs(1),
		Long: `Create a farm: a tenant's network of up to 254 subnets, 10.f.0.0/16.

With --proxy-arp, a VM's ARP for an address of another subnet is answered with
its gateway's MAC (for guests configured with a netmask wider than their /24);
without it such ARP is dropped, as on a real router.`,
		Example: "  onehop farm create blue\n  onehop farm create legacy --proxy-arp",
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := api()
			if err != nil {
				return err
			}
			var f intent.Farm
			if err := c.Do("POST", "/v1/farms", map[string]any{"name": args[0], "proxyARP": proxyARP}, &f); err != nil {
				return err
			}
			extra := ""
			if f.ProxyARP {
				extra = ", proxy ARP on"
			}
			fmt.Printf("farm %s created: 10.%d.0.0/16%s\n", f.Name, f.ID, extra)
			return nil
		},
	}
	farmCreate.Flags().BoolVar(&proxyARP, "proxy-arp", false, "answer VMs' ARP for other subnets with the gateway's MAC")
	farm.AddCommand(farmCreate)

	subnet := &cobra.Command{Use: "subnet", Short: "Subnets of a farm: a /24 each, gateway at .1"}
	subnet.AddCommand(&cobra.Command{
		Use: "create FARM/SUBNET", Short: "Create a subnet", Args: cobra.ExactArgs(1),
		Example: "  onehop subnet create blue/web",
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := splitPath(args[0], 2, "FARM/SUBNET")
			if err != nil {
				return err
			}
			c, err := api()
			if err != nil {
				return err
			}
			var s intent.Subnet
			if err := c.Do("POST", "/v1/farms/"+p[0]+"/subnets", map[string]string{"name": p[1]}, &s); err != nil {
				return err
			}
			fmt.Printf("subnet %s/%s created: %s, gateway %s\n", s.Farm, s.Name, s.Prefix, s.Gateway)
			return nil
		},
	})

	vm := &cobra.Command{Use: "vm", Short: "VMs: an address in a subnet, placed on a host"}
	var host string
	vmCreate := &cobra.Command{
		Use: "create FARM/SUBNET/VM --host HOST", Short: "Create a VM and allocate its 10.f.s.h and virtual MAC", Args: cobra.ExactArgs(1),
		Example: "  onehop vm create blue/web/web4 --host h2",
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := splitPath(args[0], 3, "FARM/SUBNET/VM")
			if err != nil {
				return err
			}
			if host == "" {
				return fmt.Errorf("--host is required: the host the VM runs on")
			}
			c, err := api()
			if err != nil {
				return err
			}
			var v intent.VM
			if err := c.Do("POST", "/v1/farms/"+p[0]+"/subnets/"+p[1]+"/vms", map[string]string{"name": p[2], "host": host}, &v); err != nil {
				return err
			}
			fmt.Printf("vm %s on %s: %s, MAC %s, gateway %s, vif %s\n", v.FullName(), v.Host, v.IP, v.MAC, v.Gateway, v.Interface)
			return nil
		},
	}
	vmCreate.Flags().StringVar(&host, "host", "", "host the VM runs on")
	var moveTo string
	vmMove := &cobra.Command{
		Use:   "move FARM/SUBNET/VM --to HOST",
		Short: "Record that a VM now runs on HOST (address and MAC stay); every host's table follows",
		Long: `Tells the controller only. Whatever migrates the VM (the hypervisor; in the lab,
'onehop lab move', which also calls this) plugs its vif in on HOST.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := splitPath(args[0], 3, "FARM/SUBNET/VM")
			if err != nil {
				return err
			}
			if moveTo == "" {
				return fmt.Errorf("--to is required: the host the VM now runs on")
			}
			c, err := api()
			if err != nil {
				return err
			}
			var v intent.VM
			if err := c.Do("PUT", "/v1/farms/"+p[0]+"/subnets/"+p[1]+"/vms/"+p[2]+"/host", map[string]string{"host": moveTo}, &v); err != nil {
				return err
			}
			fmt.Printf("vm %s now on %s (%s)\n", v.FullName(), v.Host, v.IP)
			return nil
		},
	}
	vmMove.Flags().StringVar(&moveTo, "to", "", "the host the VM now runs on")
	vm.AddCommand(vmCreate, vmMove, &cobra.Command{
		Use: "delete FARM/SUBNET/VM", Short: "Delete a VM and free its address", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := splitPath(args[0], 3, "FARM/SUBNET/VM")
			if err != nil {
				return err
			}
			c, err := api()
			if err != nil {
				return err
			}
			return c.Do("DELETE", "/v1/farms/"+p[0]+"/subnets/"+p[1]+"/vms/"+p[2], nil, nil)
		},
	})

	var proto, asFarm string
	var port uint16
	allow := &cobra.Command{
		Use:   "allow FROM TO [--proto P] [--port N]",
		Short: "Let one subnet open connections to another (one-way; replies pass)",
		Long: `FROM and TO are FARM/SUBNET. The rule belongs to FROM's farm unless --farm says
otherwise. Within a farm it takes effect at once. Across farms it takes effect
only when both farms peer (onehop peer) and both allow it, and then only what
both allow.`,
		Example: `  onehop allow blue/web blue/db --proto tcp --port 5432
  onehop allow blue/web red/web --proto tcp --port 80             # blue's side
  onehop allow blue/web red/web --proto tcp --port 80 --farm red  # red's side`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			from, err := splitPath(args[0], 2, "FARM/SUBNET")
			if err != nil {
				return err
			}
			if _, err := splitPath(args[1], 2, "FARM/SUBNET"); err != nil {
				return err
			}
			owner := asFarm
			if owner == "" {
				owner = from[0]
			}
			c, err := api()
			if err != nil {
				return err
			}
			r := intent.Rule{From: args[0], To: args[1], Proto: proto, Port: port}
			if err := c.Do("POST", "/v1/farms/"+owner+"/rules", r, &r); err != nil {
				return err
			}
			fmt.Printf("farm %s allows %s -> %s %s\n", owner, r.From, r.To, protoPort(r.Proto, r.Port))
			return nil
		},
	}
	allow.Flags().StringVar(&proto, "proto", "", "tcp, udp, icmp (default: any)")
	allow.Flags().Uint16Var(&port, "port", 0, "destination port (tcp/udp; default: any)")
	allow.Flags().StringVar(&asFarm, "farm", "", "the farm whose rule this is (default: FROM's farm)")

	peer := &cobra.Command{
		Use: "peer FARM OTHER", Short: "Let FARM talk to OTHER; takes effect once OTHER peers back", Args: cobra.ExactArgs(2),
		Example: "  onehop peer blue red && onehop peer red blue",
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := api()
			if err != nil {
				return err
			}
			var out struct{ Mutual bool }
			if err := c.Do("PUT", "/v1/farms/"+args[0]+"/peers/"+args[1], nil, &out); err != nil {
				return err
			}
			if out.Mutual {
				fmt.Printf("%s and %s peer with each other: rules both allow now apply\n", args[0], args[1])
			} else {
				fmt.Printf("%s peers with %s; nothing flows until %s peers back\n", args[0], args[1], args[1])
			}
			return nil
		},
	}

	firewall := &cobra.Command{Use: "firewall", Short: "A VM's own firewall, enforced on its host outside the VM"}
	var in, out, allowF, deny bool
	var fproto, fport, from, to, defIn, defOut string
	fwAdd := &cobra.Command{
		Use:   "add FARM/SUBNET/VM (--in|--out) (--allow|--deny) [--proto P] [--port N|LO-HI] [--from CIDR|--to CIDR]",
		Short: "Append a rule (first match wins; stateful: replies to admitted flows pass)",
		Example: `  onehop firewall add blue/web/web1 --in --proto tcp --port 22 --from 10.1.2.0/24 --deny
  onehop firewall add blue/web/web1 --default-in deny`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := splitPath(args[0], 3, "FARM/SUBNET/VM")
			if err != nil {
				return err
			}
			body := map[string]any{"defaultIn": defIn, "defaultOut": defOut}
			if in || out || allowF || deny {
				r, err := firewallRule(in, out, allowF, deny, fproto, fport, from, to)
				if err != nil {
					return err
				}
				body["rule"] = r
			} else if defIn == "" && defOut == "" {
				return fmt.Errorf("nothing to add: give a rule (--in/--out with --allow/--deny) or --default-in/--default-out")
			}
			c, err := api()
			if err != nil {
				return err
			}
			var fw intent.Firewall
			if err := c.Do("POST", "/v1/farms/"+p[0]+"/subnets/"+p[1]+"/vms/"+p[2]+"/firewall", body, &fw); err != nil {
				return err
			}
			fmt.Printf("%s firewall: default in %s, out %s, %d rules\n", args[0], fw.DefaultIn, fw.DefaultOut, len(fw.Rules))
			return nil
		},
	}
	f := fwAdd.Flags()
	f.BoolVar(&in, "in", false, "the rule matches traffic into the VM")
	f.BoolVar(&out, "out", false, "the rule matches traffic out of the VM")
	f.BoolVar(&allowF, "allow", false, "admit what matches")
	f.BoolVar(&deny, "deny", false, "drop what matches")
	f.StringVar(&fproto, "proto", "", "tcp, udp, icmp (default: any)")
	f.StringVar(&fport, "port", "", "port or LO-HI range (VM's port for --in, remote port for --out)")
	f.StringVar(&from, "from", "", "remote CIDR, with --in")
	f.StringVar(&to, "to", "", "remote CIDR, with --out")
	f.StringVar(&defIn, "default-in", "", "allow or deny what no inbound rule matches")
	f.StringVar(&defOut, "default-out", "", "allow or deny what no outbound rule matches")
	firewall.AddCommand(fwAdd)

	var output string
	get := &cobra.Command{
		Use: "get (farms|subnets|vms|rules|hosts)", Short: "List intent as the controller holds it", Args: cobra.ExactArgs(1),
		ValidArgs: []string{"farms", "subnets", "vms", "rules", "hosts"},
		Example:   "  onehop get vms\n  onehop get rules -o json",
		RunE: func(cmd *cobra.Command, args []string) error {
			if output != "text" && output != "json" {
				return fmt.Errorf("-o %q: want text or json", output)
			}
			c, err := api()
			if err != nil {
				return err
			}
			return getAndPrint(c, args[0], output)
		},
	}
	get.Flags().StringVarP(&output, "output", "o", "text", "text or json")

	var node string
	stats := &cobra.Command{
		Use: "stats [--node HOST]", Short: "Per-host datapath state: mapping table, ARP engine, vifs, drops by reason", Args: cobra.NoArgs,
		Long: `Per host, as its agent last reported (every few seconds): its VMs and vifs,
the mapping table's use (remote VMs it holds a host for, out of its fixed size),
what the ARP engine did (questions unicast to the last known host and multicast
to a farm/subnet, addresses resolved or not, packets held while resolving), and
the datapath's counters: every drop by reason and every forwarding path.
docs/virtual-router.md says what each counter means.`,
		Example: "  onehop stats\n  onehop stats --node h1",
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := api()
			if err != nil {
				return err
			}
			var sts []intent.AgentStatus
			if err := c.Do("GET", "/v1/status", nil, &sts); err != nil {
				return err
			}
			found := false
			for _, st := range sts {
				if node != "" && st.Node != node {
					continue
				}
				found = true
				fmt.Printf("%s: %d local VMs, vifs %v, applied %s at %s\n", st.Node, st.Endpoints, st.AttachedVifs, st.AppliedDigest, st.Time.Format("15:04:05"))
				if st.Error != "" {
					fmt.Printf("  error: %s\n", st.Error)
				}
				if a := st.ARP; a != nil {
					fmt.Printf("  mapping table: %d remote VMs mapped, %d being asked, of %d entries\n", a.Mapped, a.Asking, a.Capacity)
					fmt.Printf("  ARP engine: VMs' questions to the fabric %d (datapath), answered for other hosts %d, answers learned %d\n",
						st.Forwards["arp_to_fabric"], st.Forwards["arp_answered"], st.Forwards["arp_learned"])
					fmt.Printf("              agent asked %d unicast + %d multicast: resolved %d, unresolved %d; refreshed %d, expired %d, lost %d\n",
						a.UnicastRequests, a.MulticastRequests, a.Resolved, a.Unresolved, a.Refreshed, a.Expired, a.Lost)
					fmt.Printf("  held packets: %d held, %d released, %d discarded; %d VMs announced\n", a.Held, a.Released, a.Discarded, a.Announced)
				}
				for _, kv := range sortedCounters(st.Drops) {
					fmt.Printf("  dropped %-20s %d\n", kv.k, kv.v)
				}
				for _, kv := range sortedCounters(st.Forwards) {
					fmt.Printf("  forwarded %-18s %d\n", kv.k, kv.v)
				}
			}
			if !found {
				return fmt.Errorf("no agent has reported%s", map[bool]string{true: " for node " + node, false: ""}[node != ""])
			}
			return nil
		},
	}
	stats.Flags().StringVar(&node, "node", "", "only this host")
	return []*cobra.Command{farm, subnet, vm, allow, peer, firewall, get, stats}
}

func protoPort(proto string, port uint16) string {
	if proto == "" {
		proto = "any"
	}
	if port == 0 {
		return proto
	}
	return fmt.Sprintf("%s/%d", proto, port)
}

func firewallRule(in, out, allow, deny bool, proto, port, from, to string) (intent.FirewallRule, error) {
	var r intent.FirewallRule
	switch {
	case in == out:
		return r, fmt.Errorf("give exactly one of --in or --out")
	case allow == deny:
		return r, fmt.Errorf("give exactly one of --allow or --deny")
	case in && to != "":
		return r, fmt.Errorf("--to names the remote end of an --out rule; for --in use --from")
	case out && from != "":
		return r, fmt.Errorf("--from names the remote end of an --in rule; for --out use --to")
	}
	r.Dir, r.Action, r.Proto = "in", "deny", proto
	if out {
		r.Dir = "out"
	}
	if allow {
		r.Action = "allow"
	}
	lo, hi, err := policy.ParsePorts(port)
	if err != nil {
		return r, fmt.Errorf("--port: %w", err)
	}
	r.PortLo, r.PortHi = lo, hi
	r.CIDR = from + to
	if r.CIDR != "" {
		if _, err := netip.ParsePrefix(r.CIDR); err != nil {
			return r, fmt.Errorf("--from/--to %q: not a CIDR like 10.1.2.0/24", r.CIDR)
		}
	}
	return r, nil
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

func getAndPrint(c *client.Client, what, output string) error {
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	defer w.Flush()
	switch what {
	case "farms":
		var fs []intent.Farm
		if err := c.Do("GET", "/v1/farms", nil, &fs); err != nil {
			return err
		}
		if output == "json" {
			return printJSON(fs)
		}
		fmt.Fprintln(w, "FARM\tID\tADDRESSES\tPEERS\tRULES")
		for _, f := range fs {
			fmt.Fprintf(w, "%s\t%d\t10.%d.0.0/16\t%s\t%d\n", f.Name, f.ID, f.ID, strings.Join(f.Peers, ","), len(f.Rules))
		}
	case "subnets":
		var ss []intent.Subnet
		if err := c.Do("GET", "/v1/subnets", nil, &ss); err != nil {
			return err
		}
		if output == "json" {
			return printJSON(ss)
		}
		fmt.Fprintln(w, "SUBNET\tPREFIX\tGATEWAY")
		for _, s := range ss {
			fmt.Fprintf(w, "%s/%s\t%s\t%s\n", s.Farm, s.Name, s.Prefix, s.Gateway)
		}
	case "vms":
		var vs []intent.VM
		if err := c.Do("GET", "/v1/vms", nil, &vs); err != nil {
			return err
		}
		if output == "json" {
			return printJSON(vs)
		}
		fmt.Fprintln(w, "VM\tHOST\tIP\tMAC\tVIF\tFIREWALL")
		for _, v := range vs {
			fw := "-"
			if v.Firewall != nil {
				fw = fmt.Sprintf("in %s, out %s, %d rules", v.Firewall.DefaultIn, v.Firewall.DefaultOut, len(v.Firewall.Rules))
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", v.FullName(), v.Host, v.IP, v.MAC, v.Interface, fw)
		}
	case "rules":
		var rs []controller.RuleView
		if err := c.Do("GET", "/v1/rules", nil, &rs); err != nil {
			return err
		}
		if output == "json" {
			return printJSON(rs)
		}
		fmt.Fprintln(w, "FARM\tFROM\tTO\tWHAT\tIN FORCE")
		for _, r := range rs {
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%v\n", r.Farm, r.From, r.To, protoPort(r.Proto, r.Port), r.Effective)
		}
	case "hosts":
		var hs []intent.Host
		if err := c.Do("GET", "/v1/hosts", nil, &hs); err != nil {
			return err
		}
		if output == "json" {
			return printJSON(hs)
		}
		fmt.Fprintln(w, "HOST\tFABRIC ADDRESS")
		for _, h := range hs {
			fmt.Fprintf(w, "%s\t%s\n", h.Name, h.Address)
		}
	default:
		return fmt.Errorf("get %q: want farms, subnets, vms, rules or hosts", what)
	}
	return nil
}
