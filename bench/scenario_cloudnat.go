package main

import (
	"context"
	"fmt"
	"strings"
)

// natUserNetns is the NAT'd user of the cloud lab, Env.Netns's name for it.
const natUserNetns = "cloudnat"

// cloudNATScenario: the paper's baseline: a user behind plain nftables
// masquerading on gfast (no interception, no MPTCP, no LISP), routed
// natively over the same unshaped WAN to sfast's non-EID address.
var cloudNATScenario = &Scenario{
	Name:        "cloudnat",
	Description: "lab " + cloudLab.Name + ": " + netnsPrefix + natUserNetns + " behind nftables masquerade on gfast -> sfast's non-EID address, one unshaped WAN",
	// The gateway carries TCP; ping and UDP would measure native routing.
	Tests: []string{"tcp"},
	Build: func(ctx context.Context, e *Env) ([]*Pair, error) {
		l, err := cloudLabUp(ctx, e, siteFast)
		if err != nil {
			return nil, err
		}
		ns := netnsPrefix + natUserNetns
		err = e.Once("cloud nat user", func() error {
			progress("setup: user %s behind nftables masquerade on %s", ns, siteFast.gw)
			if _, err := e.Netns(ctx, natUserNetns); err != nil {
				return err
			}
			gw := l.Netns(siteFast.gw)
			if err := IP(ctx,
				[]string{"link", "add", "nat-u", "netns", ns, "type", "veth", "peer", "name", "nat-g", "netns", gw},
				[]string{"-n", ns, "addr", "add", "10.75.0.2/30", "dev", "nat-u"},
				[]string{"-n", ns, "link", "set", "nat-u", "up"},
				[]string{"-n", ns, "route", "add", "default", "via", "10.75.0.1"},
				[]string{"-n", gw, "addr", "add", "10.75.0.1/30", "dev", "nat-g"},
				[]string{"-n", gw, "link", "set", "nat-g", "up"},
			); err != nil {
				return err
			}
			rules := fmt.Sprintf("table ip onehop-bench-cloudnat {\n\tchain post { type nat hook postrouting priority srcnat; ip saddr 10.75.0.2 oifname %q masquerade; }\n}\n", siteFast.wan)
			cmd := command(ctx, "ip", "netns", "exec", gw, "nft", "-f", "-")
			cmd.Stdin = strings.NewReader(rules)
			_, err := output(cmd)
			return err
		})
		if err != nil {
			return nil, err
		}
		return []*Pair{{DstIP: siteFast.nativeAddr(), Src: InNetns(ns), Dst: mptcpServer(e.inLab(l.Name, siteFast.srv)), Server: l.Name + "/" + siteFast.srv}}, nil
	},
}
