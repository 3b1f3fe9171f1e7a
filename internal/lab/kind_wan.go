package lab

import (
	"context"
	"fmt"

	"github.com/onehop/onehop/internal/netns"
	"github.com/onehop/onehop/internal/topology"
)

// wanKind is a wide-area path of a cloud-access lab: a router namespace
// between a gateway (its gw0 link) and an xTR (its dc0 link), forwarding
// between the two, each direction shaped to the WAN's rate with tbf (this
// kernel has no netem). The links themselves are made by the gateway and
// the xTR, which come after it; `lab link NAME down|up` cuts it.
type wanKind struct{}

func (wanKind) kind() string { return "wan" }

func (wanKind) nodes(t *topology.File) []string {
	var out []string
	for _, w := range t.WANs() {
		out = append(out, w.Name)
	}
	return out
}

func (wanKind) plumb(_ context.Context, b *builder, node string) error {
	w, _ := b.t.WANByName(node)
	rate := w.Rate
	if rate == "" {
		rate = "unshaped"
	}
	b.step("wan %s (%s): router between %s and %s, %s", node, NamespaceOf(b.st.Name, node), w.GatewaySide(), w.XTRSide(), rate)
	ns, err := b.newNamespace(node, "wan")
	if err != nil {
		return err
	}
	if err := netns.WriteSysctl(ns, "net/ipv4/ip_forward", "1"); err != nil {
		return err
	}
	var ends []string
	for _, g := range b.t.Gateways() {
		for _, gw := range g.WANs {
			if gw == node {
				ends = append(ends, g.Name)
			}
		}
	}
	for _, x := range b.t.XTRs() {
		for _, xw := range x.WANs {
			if xw == node {
				ends = append(ends, x.Name)
			}
		}
	}
	return b.setCloud(node, &CloudNode{Rate: w.Rate, Ends: ends})
}

// activate shapes both of the router's links, now that the gateway and the
// xTR have made them: tbf at the WAN's rate, a burst of 10 ms of it (at
// least 32 KiB) and 20 ms of queue.
func (wanKind) activate(_ context.Context, b *builder, node string) error {
	w, _ := b.t.WANByName(node)
	if w.Rate == "" {
		return nil
	}
	burst := max(w.RateBits()/8/100, 32<<10)
	ns := NamespaceOf(b.st.Name, node)
	for _, dev := range []string{wanGatewaySide, wanXTRSide} {
		if err := runCmd("tc", "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", w.Rate,
			"burst", fmt.Sprint(burst), "latency", "20ms"); err != nil {
			return fmt.Errorf("shape wan %s: %w", node, err)
		}
	}
	return nil
}
