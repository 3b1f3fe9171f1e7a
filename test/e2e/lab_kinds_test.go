package e2e

import "testing"

// TestPrivilegedBridgeLabCarriesTrafficWithoutAController builds the
// benchmarks' baseline: the same kinds with datapath bridge, which has no
// controller and no agents, a Linux bridge per host, and vifs that come up
// once plumbed.
func TestPrivilegedBridgeLabCarriesTrafficWithoutAController(t *testing.T) {
	l := upLab(t, quickstart+"datapath: bridge\n")
	for _, n := range l.status.Nodes {
		if n.Kind == "controller" || n.Process != nil {
			t.Errorf("a bridge lab runs %s (%s, process %+v)", n.Name, n.Kind, n.Process)
		}
	}
	if err := l.ping("web1", l.ip("web2"), 2); err != nil {
		t.Errorf("across hosts: %v", err)
	}
	if err := l.ping("web1", l.ip("web3"), 2); err != nil {
		t.Errorf("on one host: %v", err)
	}
}
