package e2e

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/testenv"
)

// revokeTopo: web1 (h1) reaches db1 (h2, another subnet) by blue's rule 1,
// app1 (h2, farm red) by the peering and both farms' rules, and web2 (h2,
// its own subnet) by web2's firewall allow, rule 1 of a default deny.
const revokeTopo = `name: %s
hosts: [{name: h1}, {name: h2}]
farms:
  - name: blue
    subnets: [{name: web}, {name: db}]
    peers: [red]
    rules:
      - {from: web, to: db, proto: tcp, port: 5432}
      - {from: web, to: red/app, proto: tcp, port: 5432}
  - name: red
    subnets: [{name: app}]
    peers: [blue]
    rules:
      - {from: blue/web, to: app, proto: tcp, port: 5432}
vms:
  - {name: web1, host: h1, subnet: blue/web}
  - {name: db1, host: h2, subnet: blue/db}
  - {name: app1, host: h2, subnet: red/app}
  - name: web2
    host: h2
    subnet: blue/web
    firewall:
      default_in: deny
      rules:
        - {dir: in, proto: tcp, port: "5432", action: allow}
`

// streamPy is both ends of a TCP stream that flows both ways: each end
// sends 1 KiB every 10 ms and prints the wall-clock time of every receive,
// so the test sees when each direction stopped. "serve PORT" accepts one
// connection; "connect ADDR PORT" opens it; "probe ADDR PORT" only tries a
// new connection (exit 0 if it opens within 2 s).
const streamPy = `
import socket, sys, threading, time
mode = sys.argv[1]
if mode == "serve":
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("0.0.0.0", int(sys.argv[2])))
    ls.listen(4)
    s, _ = ls.accept()
else:
    s = socket.create_connection((sys.argv[2], int(sys.argv[3])), timeout=2)
    if mode == "probe":
        sys.exit(0)
    s.settimeout(None)
def send():
    while True:
        s.sendall(b"x" * 1024)
        time.sleep(0.01)
threading.Thread(target=send, daemon=True).start()
while True:
    d = s.recv(65536)
    if not d:
        break
    print("%.3f" % time.time(), flush=True)
`

// lastReceive is the time of the last receive an end of streamPy printed,
// and how many it printed.
func lastReceive(t *testing.T, out string) (time.Time, int) {
	t.Helper()
	var last time.Time
	n := 0
	for _, line := range strings.Fields(out) {
		f, err := strconv.ParseFloat(line, 64)
		if err != nil {
			continue // the traceback of an end killed mid-write, say
		}
		last = time.Unix(0, int64(f*1e9))
		n++
	}
	return last, n
}

// revocation streams web1 <-> vm:5432, runs the revoking verb, and checks
// that the stream stopped both ways within a second of it, that a new
// connection is refused, and that each host in cutters counted the flow
// as revoked.
func (l *testLab) revocation(vm string, cutters []string, verb ...string) {
	t := l.t
	t.Helper()
	addr := l.ip(vm)
	server := l.start(vm, "python3", "-c", streamPy, "serve", "5432")
	l.waitListening(vm, "tcp", 5432)
	client := l.start("web1", "python3", "-c", streamPy, "connect", addr, "5432")
	// The positive control: the stream flows both ways first.
	testenv.Eventually(t, "the stream web1 <-> "+vm+" to flow both ways", 10*time.Second, func() error {
		if _, n := lastReceive(t, server.Output()); n < 20 {
			return fmt.Errorf("%s received %d times:\n%s", vm, n, server.Output())
		}
		if _, n := lastReceive(t, client.Output()); n < 20 {
			return fmt.Errorf("web1 received %d times:\n%s", n, client.Output())
		}
		return nil
	})
	before := map[string]metricSet{}
	for _, h := range cutters {
		before[h] = l.metrics(h)
	}

	revoked := time.Now()
	if out, err := l.cli(verb...); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(verb, " "), err, out)
	}
	time.Sleep(3 * time.Second) // long enough to see anything still arriving
	for _, end := range []struct {
		name string
		out  string
	}{{vm, server.Stop()}, {"web1", client.Stop()}} {
		last, n := lastReceive(t, end.out)
		took := last.Sub(revoked)
		t.Logf("%s: %s received %d times; the last %v after the revoking call began", strings.Join(verb, " "), end.name, n, took.Round(time.Millisecond))
		if took > time.Second {
			t.Errorf("%s: %s still received %v after the revoking call began (want within 1 s)", strings.Join(verb, " "), end.name, took)
		}
	}
	if out, err := l.in("web1", "python3", "-c", streamPy, "probe", addr, "5432"); err == nil {
		t.Errorf("%s: a new connection web1 -> %s:5432 opened after the revocation\n%s", strings.Join(verb, " "), vm, out)
	}
	for _, h := range cutters {
		if n := rise(before[h], l.metrics(h), drops("revoked")); n < 1 {
			t.Errorf("%s: %s counted %v flows revoked, want the stream's", strings.Join(verb, " "), h, n)
		}
	}
}

// Removing a rule, a peering or a firewall allow cuts the established
// stream it admitted (issue 21, "Revocation is immediate"): within a
// second, new connections refused, counted as revoked where it was cut.
func TestPrivilegedRevokingARuleAPeeringOrAFirewallAllowCutsEstablishedStreams(t *testing.T) {
	l := upLab(t, revokeTopo)
	// Rule 1 of blue: the stream crosses subnets; both hosts check it, and
	// both ends keep sending, so each host cuts it at its own next packet.
	l.revocation("db1", []string{"h1", "h2"}, "rule", "delete", "blue", "1")
	testenv.Eventually(t, "onehop stats to show the revoked flow", 15*time.Second, func() error {
		out, err := l.cli("stats", "--node", "h1")
		if err != nil || !strings.Contains(out, "dropped revoked") {
			return fmt.Errorf("onehop stats --node h1 (%v):\n%s", err, out)
		}
		return nil
	})
	// The peering, across farms.
	l.revocation("app1", []string{"h1", "h2"}, "unpeer", "blue", "red")
	// web2's firewall allow: only web2's host holds its firewall.
	l.revocation("web2", []string{"h2"}, "firewall", "delete", "blue/web/web2", "1")
}
