package e2e

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/testenv"
)

// Floating addresses (issue 22 item 4): inet reaches web1 on a fabric
// address of the operator's pool, web1 leaves by it, and a live move of
// web1 to h2 keeps a TCP stream through it going (h2 announces it with a
// gratuitous ARP).

const floatingLab = `name: %s
hosts: [{name: h1}, {name: h2}]
farms:
  - name: blue
    subnets: [{name: web}]
vms:
  - {name: web1, host: h1, subnet: blue/web}
externals:
  - {name: inet}
`

func TestPrivilegedFloatingAddressReachesItsVMAndSurvivesALiveMove(t *testing.T) {
	testenv.RequireTool(t, "curl", "iperf3", "tcpdump", "tshark", "python3")
	l := upLab(t, floatingLab)
	inet := l.addr("inet", "eth0")
	h1 := netip.MustParseAddr(l.addr("h1", "uplink0"))
	// A free address of the fabric's /24: .200 (the lab numbers its nodes
	// from .11).
	b := h1.As4()
	b[3] = 200
	fl := netip.AddrFrom4(b).String()
	for _, n := range []string{"h1", "h2", "inet"} {
		for _, ifname := range []string{"uplink0", "eth0"} {
			for _, i := range l.node(n).Interfaces {
				if i.Name == ifname && strings.Contains(strings.Join(i.Addrs, " "), fl+"/") {
					t.Fatalf("%s already has %s on %s", n, fl, ifname)
				}
			}
		}
	}
	for _, args := range [][]string{{"floating", "create", fl}, {"floating", "attach", fl, "blue/web/web1"}} {
		if out, err := l.cli(args...); err != nil {
			t.Fatalf("onehop %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	if out, _ := l.cli("get", "vms"); !strings.Contains(out, fl) {
		t.Errorf("get vms does not show web1's floating address %s:\n%s", fl, out)
	}

	stop, _ := l.captureFile("inet", "eth0", "ip.src", "ip.dst", "tcp.dstport", "arp.opcode", "arp.src.proto_ipv4", "arp.dst.proto_ipv4", "arp.src.hw_mac")
	// inet reaches web1 on the floating address, whole: any port.
	l.start("web1", "python3", "-m", "http.server", "8080", "--bind", "0.0.0.0")
	l.waitListening("web1", "tcp", 8080)
	testenv.Eventually(t, "inet fetches from web1 on "+fl, 20*time.Second, func() bool {
		out, err := l.in("inet", "curl", "-sf", "-m", "2", "http://"+fl+":8080/")
		return err == nil && strings.Contains(out, "Directory listing")
	})
	// web1 reaches inet from the floating address.
	l.start("inet", "python3", "-m", "http.server", "8081", "--bind", inet)
	l.waitListening("inet", "tcp", 8081)
	if out, err := l.in("web1", "curl", "-sf", "-m", "5", "http://"+inet+":8081/"); err != nil || !strings.Contains(out, "Directory listing") {
		t.Fatalf("web1: curl http://%s:8081/: %v\n%s", inet, err, out)
	}

	// A TCP stream from inet to the floating address, with web1 moved to h2
	// while it runs.
	l.start("web1", "iperf3", "-s", "-1")
	l.waitListening("web1", "tcp", 5201)
	client := l.start("inet", "iperf3", "-c", fl, "-t", "8", "-C", "cubic", "-J")
	testenv.Eventually(t, "inet's TCP stream to "+fl+" to carry data", 10*time.Second, func() error {
		acked, err := l.bytesAcked("inet", fl+":5201")
		if err == nil && acked < 1<<20 {
			err = fmt.Errorf("%d bytes acked so far", acked)
		}
		return err
	})
	streaming := time.Now()
	l.onehop("lab", "move", "web1", "--to", "h2")
	testenv.Eventually(t, "inet to reach web1 on h2 through "+fl, 10*time.Second, func() bool {
		_, err := l.in("inet", "curl", "-sf", "-m", "1", "-o", "/dev/null", "http://"+fl+":8080/")
		return err == nil
	})
	movedAfter := time.Since(streaming)
	t.Logf("web1 reachable on h2 through %s %.2fs into the stream", fl, movedAfter.Seconds())
	testenv.Eventually(t, "the TCP stream to finish", 20*time.Second, func() bool {
		return strings.Contains(client.Output(), `"sum_received"`)
	})
	streamCarriedDataAfter(t, client.Stop(), movedAfter.Seconds()+1)

	// What inet saw: web1's packets from the floating address, and h2's
	// gratuitous ARP for it, from h2's uplink MAC.
	h2MAC := l.mac("h2", "uplink0")
	fromFloating, garp := 0, 0
	for _, line := range stop() {
		f := strings.Split(line, "\t")
		for len(f) < 7 {
			f = append(f, "")
		}
		if f[0] == fl && f[1] == inet {
			fromFloating++
		}
		if f[3] == "1" && f[4] == fl && f[5] == fl && strings.EqualFold(f[6], h2MAC) {
			garp++
		}
	}
	if fromFloating == 0 {
		t.Errorf("inet's capture saw no packet from %s to inet (was the capture live?)", fl)
	}
	if garp == 0 {
		t.Errorf("inet's capture saw no gratuitous ARP for %s from h2 (%s)", fl, h2MAC)
	}
	if out, _ := l.cli("floating", "list"); !strings.Contains(out, "blue/web/web1") || !strings.Contains(out, "h2") {
		t.Errorf("floating list after the move:\n%s", out)
	}
}
