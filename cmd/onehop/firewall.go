package main

import (
	"cmp"
	"errors"
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/onehop/onehop/internal/controller"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/policy"
)

func firewallCmd() *cobra.Command {
	firewall := &cobra.Command{Use: "firewall", Short: "A VM's own firewall, enforced on its host outside the VM"}
	firewall.AddCommand(firewallAddCmd(), firewallListCmd(), firewallDeleteCmd())
	return firewall
}

// firewallPath is the API path of VM FARM/SUBNET/VM's firewall.
func firewallPath(vm string) (string, error) {
	p, err := splitPath(vm, 3, "FARM/SUBNET/VM")
	if err != nil {
		return "", err
	}
	return "/v1/farms/" + p[0] + "/subnets/" + p[1] + "/vms/" + p[2] + "/firewall", nil
}

func firewallListCmd() *cobra.Command {
	var output outputFormat
	cmd := &cobra.Command{
		Use: "list FARM/SUBNET/VM [-o json]", Short: "Show a VM's firewall: its defaults and its rules in order, with their ids", Args: cobra.ExactArgs(1),
		Example: "  onehop firewall list blue/web/web1",
		RunE: func(cmd *cobra.Command, args []string) error {
			path, err := firewallPath(args[0])
			if err != nil {
				return err
			}
			c, err := api()
			if err != nil {
				return err
			}
			var fw intent.Firewall
			if err := c.Do("GET", path, nil, &fw); err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if output == jsonOutput {
				return printJSON(out, fw)
			}
			fmt.Fprintf(out, "%s firewall: default in %s, out %s (first match wins)\n", args[0], fw.DefaultIn, fw.DefaultOut)
			w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
			defer w.Flush()
			fmt.Fprintln(w, "ID\tDIR\tPROTO\tPORTS\tREMOTE\tACTION")
			for _, r := range fw.Rules {
				fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\n", r.ID, r.Dir, cmp.Or(r.Proto, "any"), fwPorts(r), cmp.Or(r.CIDR, "any"), r.Action)
			}
			return nil
		},
	}
	addOutputFlag(cmd.Flags(), &output)
	return cmd
}

// fwPorts is a rule's port range as --port takes it: any, 22, 8000-8080.
func fwPorts(r intent.FirewallRule) string {
	switch {
	case r.PortLo == 0:
		return "any"
	case r.PortLo == r.PortHi:
		return fmt.Sprint(r.PortLo)
	}
	return fmt.Sprintf("%d-%d", r.PortLo, r.PortHi)
}

func firewallDeleteCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "delete FARM/SUBNET/VM ID",
		Short: "Delete a rule of a VM's firewall: removing an allow cuts what it admitted",
		Long: `Deletes rule ID (as firewall list shows it; the other rules keep theirs) of the
VM's firewall. When an allow goes, the VM's host refuses new connections it
alone admitted at once and cuts established ones at their next packet,
counting each under the drop reason revoked (onehop stats).`,
		Example: "  onehop firewall delete blue/web/web1 2",
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			path, err := firewallPath(args[0])
			if err != nil {
				return err
			}
			id, err := controller.ParseRuleID("ID", args[1])
			if err != nil {
				return err
			}
			c, err := api()
			if err != nil {
				return err
			}
			var fw intent.Firewall
			if err := c.Do("DELETE", fmt.Sprintf("%s/rules/%d", path, id), nil, &fw); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "rule %d of %s's firewall deleted; %d rules left\n", id, args[0], len(fw.Rules))
			return nil
		},
	}
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
			path, err := firewallPath(args[0])
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
			if err := c.Do("POST", path, body, &fw); err != nil {
				return err
			}
			added := ""
			if _, ok := body["rule"]; ok && len(fw.Rules) > 0 {
				added = fmt.Sprintf(" (rule %d added)", fw.Rules[len(fw.Rules)-1].ID)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s firewall: default in %s, out %s, %d rules%s\n", args[0], fw.DefaultIn, fw.DefaultOut, len(fw.Rules), added)
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
