package main

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
)

// The multipath cloud-access lab (issue 11), one lab for all five cloud
// scenarios: three gateway/xTR pairs side by side, each with its own WANs,
// user and MPTCP server (iperf3 under mptcpize):
//   - gfast -- wfast (unshaped) -- xfast -- sfast: the paper's experiment
//     on one path (NAT, interception only, the full gateway);
//   - gtwo -- wa, wb (100 Mbit/s each) -- xtwo -- stwo: aggregation;
//   - gone -- wc (100 Mbit/s) -- xone -- sone: its one-path baseline.
//
// The gateway carries TCP only; ping and UDP (the bench's rtt and udp64
// figures, which every scenario measures) are routed natively, so each
// pair gets routes through its WAN router (what a LISP site has for
// non-EID traffic). Their figures are informational.
var cloudLab = LabSpec{Name: "benchcl", Datapath: "onehop", Body: `wans:
  - {name: wfast}
  - {name: wa, rate: 100mbit}
  - {name: wb, rate: 100mbit}
  - {name: wc, rate: 100mbit}
gateways:
  - {name: gfast, wans: [wfast], users: [{name: ufull}]}
  - {name: gtwo, wans: [wa, wb], users: [{name: utwo}]}
  - {name: gone, wans: [wc], users: [{name: uone}]}
xtrs:
  - {name: xfast, wans: [wfast], servers: [{name: sfast}]}
  - {name: xtwo, wans: [wa, wb], servers: [{name: stwo}]}
  - {name: xone, wans: [wc], servers: [{name: sone}]}
`}

// cloudSite is one gateway/xTR pair of cloudLab and the addresses the
// topology gives it (gateway and xTR i: EIDs 10.77.i.0/24 and 10.88.i.0/24,
// users 10.76.i.0/24; WAN n, in file order from 1: 172.31.n.0/24).
type cloudSite struct {
	gw, user, xtr, srv string
	wan                string // the WAN its native routes use
	i, n               int
}

var (
	siteFast = cloudSite{gw: "gfast", user: "ufull", xtr: "xfast", srv: "sfast", wan: "wfast", i: 0, n: 1}
	siteTwo  = cloudSite{gw: "gtwo", user: "utwo", xtr: "xtwo", srv: "stwo", wan: "wa", i: 1, n: 2}
	siteOne  = cloudSite{gw: "gone", user: "uone", xtr: "xone", srv: "sone", wan: "wc", i: 2, n: 4}
)

// srvEID is the site's server's EID.
func (s cloudSite) srvEID() string { return fmt.Sprintf("10.88.%d.10", s.i) }

// nativeAddr is a second address of the site's server outside every EID
// prefix: the map-resolver answers negatively for it, so the gateway
// proxies it as plain TCP and routes it natively (interception only).
func (s cloudSite) nativeAddr() string { return fmt.Sprintf("10.99.%d.10", s.i) }

// cloudLabUp brings the lab up and gives site its native routes: user and
// server nets through the WAN router, and the server's native address.
func cloudLabUp(ctx context.Context, e *Env, s cloudSite) (*Lab, error) {
	l, err := e.Lab(ctx, cloudLab)
	if err != nil {
		return nil, err
	}
	err = e.Once("cloud native routes "+s.gw, func() error {
		progress("setup: native routes for ping and UDP through %s (%s -> %s)", s.wan, s.gw, s.xtr)
		gwSide, router1, router2, xtrSide := fmt.Sprintf("172.31.%d.2", s.n), fmt.Sprintf("172.31.%d.1", s.n), fmt.Sprintf("172.31.%d.129", s.n), fmt.Sprintf("172.31.%d.130", s.n)
		srvNet, nat, users := fmt.Sprintf("10.88.%d.0/24", s.i), fmt.Sprintf("10.99.%d.0/24", s.i), fmt.Sprintf("10.76.%d.0/24", s.i)
		return IP(ctx,
			[]string{"-n", l.Netns(s.gw), "route", "add", srvNet, "via", router1},
			[]string{"-n", l.Netns(s.gw), "route", "add", nat, "via", router1},
			[]string{"-n", l.Netns(s.wan), "route", "add", srvNet, "via", xtrSide},
			[]string{"-n", l.Netns(s.wan), "route", "add", nat, "via", xtrSide},
			[]string{"-n", l.Netns(s.wan), "route", "add", users, "via", gwSide},
			[]string{"-n", l.Netns(s.xtr), "route", "add", users, "via", router2},
			[]string{"-n", l.Netns(s.xtr), "route", "add", s.nativeAddr() + "/32", "dev", "s-" + s.srv},
			[]string{"-n", l.Netns(s.srv), "addr", "add", s.nativeAddr() + "/32", "dev", "eth0"},
		)
	})
	return l, err
}

// mptcpServer runs the iperf3 server under mptcpize (its TCP sockets are
// MPTCP; a plain TCP client still gets TCP), every other command as is.
func mptcpServer(c Cmd) Cmd {
	return func(ctx context.Context, argv ...string) *exec.Cmd {
		if len(argv) > 1 && argv[0] == "iperf3" && strings.Contains(strings.Join(argv, " "), " -s") {
			argv = append([]string{"mptcpize", "run"}, argv...)
		}
		return c(ctx, argv...)
	}
}

// cloudPair is the site's user -> its server at dst, through the gateway.
func cloudPair(e *Env, l *Lab, s cloudSite, dst string) *Pair {
	return &Pair{DstIP: dst, Src: e.inLab(l.Name, s.user), Dst: mptcpServer(e.inLab(l.Name, s.srv)), Server: l.Name + "/" + s.srv}
}
