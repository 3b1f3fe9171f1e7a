package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/testenv"
)

// Published ports (issue 22, item 3): a VM's port reached from inet on its
// host's address, with inet's own address seen by the VM's server; a farm
// without egress needs none for it.
const publishLab = `name: %s
hosts:
  - name: h1
farms:
  - name: blue
    subnets:
      - name: web
vms:
  - {name: web1, host: h1, subnet: blue/web}
externals:
  - {name: inet}
`

func TestPrivilegedAPublishedPortIsReachedFromInetWithItsOwnAddress(t *testing.T) {
	testenv.RequireTool(t, "curl")
	l := upLab(t, publishLab)
	inet, h1 := l.addr("inet", "eth0"), l.addr("h1", "uplink0")
	// The published server, whose log names each client by its address,
	// and one on a port nobody published.
	srv := l.start("web1", "python3", "-m", "http.server", "8000")
	l.start("web1", "python3", "-m", "http.server", "8001")
	l.waitListening("web1", "tcp", 8000)
	l.waitListening("web1", "tcp", 8001)
	l.mustIn("web1", "curl", "-sf", "-m", "2", "-o", "/dev/null", "http://127.0.0.1:8001/") // it serves

	if out, err := l.cli("vm", "publish", "blue/web/web1", "--proto", "tcp", "--port", "8000", "--public-port", "8080"); err != nil ||
		!strings.Contains(out, "published tcp 8000 on 8080") {
		t.Fatalf("vm publish: %v\n%s", err, out)
	}
	if out, _ := l.cli("vm", "publications"); !strings.Contains(out, h1+":8080") {
		t.Errorf("vm publications does not show %s:8080:\n%s", h1, out)
	}
	url := "http://" + h1 + ":8080/"
	testenv.Eventually(t, "inet reaches web1 on "+url, 20*time.Second, func() bool {
		_, err := l.in("inet", "curl", "-sf", "-m", "2", "-o", "/dev/null", url)
		return err == nil
	})
	if out, err := l.in("inet", "curl", "-sf", "-m", "5", url); err != nil || !strings.Contains(out, "Directory listing") {
		t.Fatalf("inet: curl %s: %v\n%s", url, err, out)
	}
	// The server saw inet itself: no SNAT on the way in.
	testenv.Eventually(t, "web1's server logs inet's address", 5*time.Second, func() bool {
		return strings.Contains(srv.Output(), inet+` - - [`)
	})
	if strings.Contains(srv.Output(), h1+` - - [`) {
		t.Errorf("web1's server saw the host's address %s:\n%s", h1, srv.Output())
	}
	// Nothing else of web1 is reached: not its unpublished port, nor the
	// published one by its own number.
	for _, port := range []string{"8001", "8000"} {
		if out, err := l.in("inet", "curl", "-sf", "-m", "2", "-o", "/dev/null", "http://"+h1+":"+port+"/"); err == nil {
			t.Errorf("inet reached %s:%s, which is not published:\n%s", h1, port, out)
		}
	}
	if m := l.metrics("h1"); m.at(`onehop_egress_packets_total{dir="in",vm="blue/web/web1"}`) < 1 {
		t.Errorf("h1's /metrics counts no packet into web1 by its publication")
	}

	if out, err := l.cli("stats"); err != nil || !strings.Contains(out, "egress blue/web/web1") || !strings.Contains(out, "published ports only") {
		t.Errorf("onehop stats shows no line for web1's publication: %v\n%s", err, out)
	}

	if out, err := l.cli("vm", "unpublish", "blue/web/web1", "--proto", "tcp", "--port", "8000"); err != nil {
		t.Fatalf("vm unpublish: %v\n%s", err, out)
	}
	testenv.Eventually(t, "inet no longer reaches "+url, 20*time.Second, func() bool {
		_, err := l.in("inet", "curl", "-sf", "-m", "2", "-o", "/dev/null", url)
		return err != nil
	})
	l.mustIn("web1", "curl", "-sf", "-m", "2", "-o", "/dev/null", "http://127.0.0.1:8000/") // still serving: the publication went, not the server
}
