package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/testenv"
)

// wideCloud is a lab whose cloud is created with the 12/6/6 plan and 300
// farms: big, the 300th, holds the VMs, so its id (300) is past what
// 10.f.s.h can carry.
func wideCloud() string {
	var b strings.Builder
	b.WriteString("name: %s\nplan: 10.0.0.0/8:12/6/6\nhosts: [{name: h1}, {name: h2}]\nfarms:\n")
	for i := 1; i < 300; i++ {
		fmt.Fprintf(&b, "  - {name: f%d, subnets: [{name: s}]}\n", i)
	}
	b.WriteString(`  - name: big
    subnets: [{name: web}, {name: db}]
vms:
  - {name: web1, host: h1, subnet: big/web}
  - {name: web2, host: h2, subnet: big/web}
  - {name: web3, host: h1, subnet: big/web}
  - {name: db1, host: h2, subnet: big/db}
  - {name: db2, host: h1, subnet: big/db}
`)
	return b.String()
}

func TestPrivilegedATwelveSixSixCloudCarriesFarm300AndKeepsItsBroadcastInTheSubnet(t *testing.T) {
	testenv.RequireTool(t, "iperf3")
	l := upLab(t, wideCloud())
	if out, err := l.cli("plan", "show"); err != nil || !strings.Contains(out, "plan 10.0.0.0/8:12/6/6") || !strings.Contains(out, "holds 4095 farms of 63 subnets of 61 VMs") {
		t.Fatalf("plan show: %v\n%s", err, out)
	}
	if out, err := l.cli("farm", "get", "big", "-o", "json"); err != nil || !strings.Contains(out, `"id": 300`) {
		t.Fatalf("farm big is not farm 300: %v\n%s", err, out)
	}
	// 300<<12 | 1<<6 | 2: farm 300, subnet 1, host 2; a /26 each subnet.
	if got := l.ip("web1"); got != "10.18.192.66" {
		t.Fatalf("web1 is %s, want 10.18.192.66", got)
	}
	if out := l.mustIn("web1", "ip", "-4", "-o", "addr", "show", "dev", "eth0"); !strings.Contains(out, "10.18.192.66/26") {
		t.Fatalf("web1's eth0 is not a /26 of the plan: %s", out)
	}
	// The uplinks joined farm 300's subnet group, its id's high byte in
	// the MAC's second byte.
	if out := l.mustIn("h1", "ip", "maddr", "show", "dev", "uplink0"); !strings.Contains(out, "03:01:0a:2c:01:00") {
		t.Fatalf("h1's uplink did not join 300/1's group 03:01:0a:2c:01:00:\n%s", out)
	}

	// Two VMs of farm 300 on different hosts talk: ping both ways, TCP.
	for _, p := range [][2]string{{"web1", "web2"}, {"web2", "web1"}} {
		if err := l.ping(p[0], l.ip(p[1]), 3); err != nil {
			t.Fatal(err)
		}
	}
	l.start("web2", "iperf3", "-s", "-1", "-p", "5201")
	l.waitListening("web2", "tcp", 5201)
	if out, err := l.in("web1", "timeout", "20", "iperf3", "-c", l.ip("web2"), "-p", "5201", "-n", "2M"); err != nil || !strings.Contains(out, "iperf Done") {
		t.Fatalf("tcp web1 -> web2 across hosts: %v\n%s", err, out)
	}

	// A subnet broadcast (.127 of the /26) reaches its subnet's VMs on
	// both hosts and not the other subnet of the same farm.
	peers := map[string]string{"web2": "web3", "web3": "web2", "db1": "db2", "db2": "db1"}
	ws := map[string]*watch{}
	var all []*watch
	for _, vm := range []string{"web2", "web3", "db1", "db2"} {
		ws[vm] = l.watchVM(vm, peers[vm])
		all = append(all, ws[vm])
	}
	proveLive(t, "start", all...)
	l.sendUDP("web1", "10.18.192.127", 1, "subnet-bcast")
	l.sendUDP("web1", "255.255.255.255", 1, "limited-bcast")
	stopWatches(t, all...)
	for vm, want := range map[string]bool{"web2": true, "web3": true, "db1": false, "db2": false} {
		for _, msg := range []string{"subnet-bcast", "limited-bcast"} {
			has := slices.ContainsFunc(ws[vm].frames, func(f frame) bool { return f.payload == msg })
			if has != want {
				t.Errorf("%s received %q: %v, want %v", vm, msg, has, want)
			}
		}
	}

	// The plan cannot change under a cloud that holds anything.
	out, err := l.cli("plan", "set", "10.0.0.0/8:8/8/8")
	if err == nil || !strings.Contains(out, "cannot become 10.0.0.0/8:8/8/8: the cloud holds host h1, host h2, farm big") {
		t.Fatalf("plan change on a non-empty cloud: %v\n%s", err, out)
	}
	if out, err := l.cli("plan", "show"); err != nil || !strings.Contains(out, "plan 10.0.0.0/8:12/6/6") {
		t.Fatalf("plan after the refused change: %v\n%s", err, out)
	}
	if err := l.ping("web1", l.ip("web3"), 2); err != nil {
		t.Fatalf("after the refused change: %v", err)
	}
}
