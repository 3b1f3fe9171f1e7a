package main

import (
	"context"
	"fmt"
	"strings"
)

// portspaceLab: h1 leases ports 10000-10999 to sliver s1, which shares
// h1's address and MAC; inet is a plain machine on the fabric (the
// Internet, for the lab). The sliver, the host's own stack and the NAT'd
// guest all talk to the same iperf3 server in inet, over the same uplink.
var portspaceLab = LabSpec{Name: "benchps", Datapath: "onehop", Body: `slivers:
  - {name: s1, host: h1, ports: "10000-10999"}
externals:
  - {name: inet}
`}

// sliverScenario: sliver s1 -> inet. Every packet out passes the sliver
// link's confinement checks; every packet back is steered by port on the
// uplink.
var sliverScenario = &Scenario{
	Name:        "sliver",
	Description: "lab " + portspaceLab.Name + ": sliver s1 (h1's address, ports 10000-10999) -> inet on the fabric, through onehop's port-space datapath",
	Build: func(ctx context.Context, e *Env) ([]*Pair, error) {
		l, err := e.Lab(ctx, portspaceLab)
		if err != nil {
			return nil, err
		}
		p, err := l.Pair("s1", "inet")
		return []*Pair{p}, err
	},
	Baselines: []Baseline{
		// Issue 8: a sliver is as fast as its host's own stack on the
		// same address...
		{Scenario: "pshost", Targets: map[string]Target{"tcp": {Ratio: 0.97}, "udp64": {Ratio: 0.97}, "rtt": {Ratio: 1.05}}},
		// ...and beats the paper's baseline, a guest behind NAT.
		{Scenario: "nat", Targets: map[string]Target{"udp64": {Ratio: 1.5}, "rtt": {Ratio: 1.0, Strict: true}}},
	},
}

// psHostScenario: h1's own stack -> inet, on the address s1 shares. The
// host's traffic crosses the uplink's program too (ports nobody leases go
// to the host's stack).
var psHostScenario = &Scenario{
	Name:        "pshost",
	Description: "lab " + portspaceLab.Name + ": host h1's own stack -> inet, the address its sliver shares",
	Build: func(ctx context.Context, e *Env) ([]*Pair, error) {
		l, err := e.Lab(ctx, portspaceLab)
		if err != nil {
			return nil, err
		}
		p, err := l.Pair("h1", "inet")
		return []*Pair{p}, err
	},
}

// natNetns is the NAT'd guest, Env.Netns's name for it.
const natNetns = "natguest"

// natScenario: the paper's baseline (CoreLab before port-space isolation,
// §2.2): a guest with a private address behind nftables SNAT/DNAT on h1,
// routed by h1's stack, -> inet.
var natScenario = &Scenario{
	Name:        "nat",
	Description: "lab " + portspaceLab.Name + ": guest " + netnsPrefix + natNetns + " (172.31.0.2, private) behind nftables SNAT/DNAT on h1 -> inet",
	Build:       natToInet(portspaceLab, natNetns),
}

// natToInet builds the pair of a guest (Env.Netns's name) behind nftables
// NAT on h1 of spec's lab (withNATGuest) -> inet.
func natToInet(spec LabSpec, guest string) func(ctx context.Context, e *Env) ([]*Pair, error) {
	return func(ctx context.Context, e *Env) ([]*Pair, error) {
		l, err := e.Lab(ctx, spec)
		if err != nil {
			return nil, err
		}
		ns, err := withNATGuest(ctx, e, l, guest)
		if err != nil {
			return nil, err
		}
		inet, err := l.Addr("inet")
		if err != nil {
			return nil, err
		}
		return []*Pair{{DstIP: inet, Src: InNetns(ns), Dst: e.inLab(l.Name, "inet"), Server: l.Name + "/inet"}}, nil
	}
}

// withNATGuest plugs a guest namespace (Env.Netns's name) into h1 of l
// behind NAT: a veth to h1 (172.31.0.1/30 on h1's side), h1 forwarding,
// and a table of its own in h1's nftables that masquerades the guest's
// traffic out of the uplink and forwards ports 11000-11999 of h1's address
// to it.
func withNATGuest(ctx context.Context, e *Env, l *Lab, name string) (string, error) {
	ns := netnsPrefix + name
	err := e.Once("nat guest "+name, func() error {
		progress("setup: guest %s behind nftables NAT on %s's h1", ns, l.Name)
		if _, err := e.Netns(ctx, name); err != nil {
			return err
		}
		h1 := l.Netns("h1")
		pub, err := NodeAddress(l.status, "h1", "uplink0")
		if err != nil {
			return err
		}
		if err := IP(ctx,
			[]string{"link", "add", "nat-g", "netns", ns, "type", "veth", "peer", "name", "nat-h", "netns", h1},
			[]string{"-n", ns, "addr", "add", "172.31.0.2/30", "dev", "nat-g"},
			[]string{"-n", ns, "link", "set", "nat-g", "up"},
			[]string{"-n", ns, "route", "add", "default", "via", "172.31.0.1"},
			[]string{"-n", h1, "addr", "add", "172.31.0.1/30", "dev", "nat-h"},
			[]string{"-n", h1, "link", "set", "nat-h", "up"},
			[]string{"netns", "exec", h1, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1"},
		); err != nil {
			return err
		}
		rules := fmt.Sprintf(`table ip onehop-bench-nat {
	chain pre { type nat hook prerouting priority dstnat; ip daddr %[1]s tcp dport 11000-11999 dnat to 172.31.0.2; ip daddr %[1]s udp dport 11000-11999 dnat to 172.31.0.2; }
	chain post { type nat hook postrouting priority srcnat; ip saddr 172.31.0.2 oifname "uplink0" meta l4proto { tcp, udp } snat to %[1]s:11000-11999; ip saddr 172.31.0.2 oifname "uplink0" snat to %[1]s; }
}
`, pub)
		cmd := command(ctx, "ip", "netns", "exec", h1, "nft", "-f", "-")
		cmd.Stdin = strings.NewReader(rules)
		_, err = output(cmd)
		return err
	})
	return ns, err
}
