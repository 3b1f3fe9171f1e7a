package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/policy"
)

func firewallCmd() *cobra.Command {
	firewall := &cobra.Command{Use: "firewall", Short: "A VM's own firewall, enforced on its host outside the VM"}
	firewall.AddCommand(firewallAddCmd())
	return firewall
}

func firewallAddCmd() *cobra.Command {
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
			if defIn, err = policy.NormalizeAction("defaultIn", defIn, true); err != nil {
				return flagErr(err, firewallFlags)
			}
			if defOut, err = policy.NormalizeAction("defaultOut", defOut, true); err != nil {
				return flagErr(err, firewallFlags)
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
	return fwAdd
}

// firewallFlags names the flag behind each field policy checks, so an error
// points at what to change on the command line.
var firewallFlags = map[string]string{
	"dir": "--in/--out", "action": "--allow/--deny", "proto": "--proto", "portLo": "--port", "portHi": "--port",
	"cidr": "--from/--to", "defaultIn": "--default-in", "defaultOut": "--default-out",
}

// flagErr turns a *policy.FieldError into "--flag: message".
func flagErr(err error, flags map[string]string) error {
	var fe *policy.FieldError
	if errors.As(err, &fe) {
		if f, ok := flags[fe.Field]; ok {
			return fmt.Errorf("%s: %s", f, fe.Msg)
		}
	}
	return err
}

// firewallRule builds the rule the flags describe and checks it with the
// controller's own check (policy.NormalizeFirewallRule), so a mistake is
// named by its flag before anything is sent.
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
	r, err = policy.NormalizeFirewallRule(r)
	return r, flagErr(err, firewallFlags)
}
