package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/testenv"
	"github.com/onehop/onehop/internal/vnatd"
)

const vnatPair = `name: %s
hosts: [{name: h1}, {name: h2}, {name: h3}]
farms:
  - name: blue
    subnets: [{name: web}, {name: db}, {name: app}]
    rules: [{from: web, to: db}, {from: db, to: web}, {from: db, to: app}, {from: app, to: db}]
vms:
  - {name: web1, host: h1, subnet: blue/web, vnat: true}
  - {name: db1, host: h3, subnet: blue/db, vnat: true}
`

// echoServer echoes every line on TCP 7100.
const echoServer = `
import socket, threading
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 7100)); s.listen(8)
print("listening", flush=True)
def serve(c):
    f = c.makefile("rwb")
    for line in f:
        f.write(line); f.flush()
while True:
    c, _ = s.accept(); threading.Thread(target=serve, args=(c,), daemon=True).start()
`

// echoClient holds one TCP connection to ADDR:7100 and echoes a line
// every 100 ms, printing "echo N" for each that comes back; a 30 s stall
// or any error ends it with "error".
const echoClient = `
import socket, sys, time
c = socket.create_connection((sys.argv[1], 7100), timeout=30)
print("local %s:%d" % c.getsockname(), flush=True)
f = c.makefile("rwb")
n = 0
try:
    while True:
        n += 1
        f.write(b"line %d\n" % n); f.flush()
        if f.readline() != b"line %d\n" % n:
            print("error: wrong echo", flush=True); break
        print("echo %d" % n, flush=True)
        time.sleep(0.1)
except Exception as e:
    print("error: %s" % e, flush=True)
`

// vnatLogs are the lab's VNAT daemons' logs (lab down removes them).
func vnatLogs(l *testLab) string {
	var b strings.Builder
	for _, n := range []string{"web1", "db1"} {
		out, err := os.ReadFile(filepath.Join(testRoot, l.name, "vnat-"+n+".log"))
		fmt.Fprintf(&b, "--- vnat-%s.log (%v):\n%s", n, err, out)
		fmt.Fprintf(&b, "--- %s routes:\n%s", n, l.mustIn(n, "ip", "-4", "route"))
	}
	return b.String()
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

var echoCount = regexp.MustCompile(`echo (\d+)\n`)

func lastEcho(out string) int {
	m := echoCount.FindAllStringSubmatch(out, -1)
	if len(m) == 0 {
		return 0
	}
	n, _ := strconv.Atoi(m[len(m)-1][1])
	return n
}

// A live TCP connection between two VNAT VMs survives one of them moving
// to another subnet on another host (`lab move --subnet`), then the other:
// the daemons the lab started find each other, key (first contact) and
// translate; the same process and socket carry on, and status shows the
// migration.
func TestPrivilegedVNATConnectionSurvivesASubnetMove(t *testing.T) {
	testenv.RequireTool(t, "udhcpc", "python3")
	l := upLab(t, vnatPair)
	server := l.start("db1", "python3", "-c", echoServer)
	defer server.Stop()
	testenv.Eventually(t, "db1's echo server", 10*time.Second, func() bool { return strings.Contains(server.Output(), "listening") })
	client := l.start("web1", "python3", "-c", echoClient, l.ip("db1"))
	defer client.Stop()
	testenv.Eventually(t, "echoes before the move", 10*time.Second, func() bool {
		if strings.Contains(client.Output(), "error") {
			t.Fatalf("client: %s\nserver: %s", client.Output(), server.Output())
		}
		return lastEcho(client.Output()) >= 5
	})
	local := strings.TrimSpace(strings.TrimPrefix(strings.SplitN(client.Output(), "\n", 2)[0], "local "))
	virt := local + "->" + l.ip("db1") + ":7100"

	status := func(node string) []vnatd.ConnStatus {
		var r vnatd.Reply
		out := l.mustIn(node, binary, "vnat", "status", "-o", "json")
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("%s: vnat status -o json: %v\n%s", node, err, out)
		}
		return r.Conns
	}
	find := func(node, v string) (vnatd.ConnStatus, bool) {
		for _, c := range status(node) {
			if c.Virtual == v {
				return c, true
			}
		}
		return vnatd.ConnStatus{}, false
	}
	testenv.Eventually(t, "the connection keyed at first contact", 15*time.Second, func() bool {
		c, ok := find("web1", virt)
		return ok && c.Keyed && c.State == "active"
	})

	l.onehop("lab", "move", "web1", "--to", "h2", "--subnet", "blue/db")
	l.refresh()
	newIP := l.node("web1").VM.IP
	before := lastEcho(client.Output())
	testenv.Eventually(t, "20 more echoes after the move", 30*time.Second, func() bool {
		return lastEcho(client.Output()) >= before+20 || strings.Contains(client.Output(), "error")
	})
	if strings.Contains(client.Output(), "error") {
		t.Fatalf("the connection broke across the move:\n%s\n%s", lastLines(client.Output(), 3), vnatLogs(l))
	}
	c, ok := find("web1", virt)
	port := local[strings.LastIndexByte(local, ':'):]
	if !ok || c.State != "migrated" || !strings.HasPrefix(c.Physical, newIP+port+"->") {
		t.Errorf("web1's status of %s after the move: %+v (found %v), want migrated from %s%s", virt, c, ok, newIP, port)
	}
	dbOld := l.ip("db1")
	rv := dbOld + ":7100->" + local
	if c, ok := find("db1", rv); !ok || c.State != "migrated" || !strings.HasSuffix(c.Physical, "->"+newIP+port) {
		t.Errorf("db1's status of %s after the move: %+v (found %v), want migrated to %s%s", rv, c, ok, newIP, port)
	}

	// Then the other end moves too (to blue/app on h1): its daemon finds
	// web1 where it is now. (A move into blue/web, web1's old subnet, is
	// vnat_location_test.go's: the §3.4.2 conflict the controller avoids.)
	l.onehop("lab", "move", "db1", "--to", "h1", "--subnet", "blue/app")
	l.refresh()
	dbNew := l.node("db1").VM.IP
	before = lastEcho(client.Output())
	testenv.Eventually(t, "20 more echoes after the second move", 30*time.Second, func() bool {
		return lastEcho(client.Output()) >= before+20 || strings.Contains(client.Output(), "error")
	})
	if strings.Contains(client.Output(), "error") {
		t.Fatalf("the connection broke across the second move:\n%s\n%s", lastLines(client.Output(), 3), vnatLogs(l))
	}
	if c, ok := find("db1", rv); !ok || c.State != "migrated" || c.Physical != dbNew+":7100->"+newIP+port {
		t.Errorf("db1's status after both moved: %+v (found %v), want %s:7100->%s%s", c, ok, dbNew, newIP, port)
	}
	if c, ok := find("web1", virt); !ok || c.State != "migrated" || c.Physical != newIP+port+"->"+dbNew+":7100" {
		t.Errorf("web1's status after both moved: %+v (found %v), want %s%s->%s:7100", c, ok, newIP, port, dbNew)
	}
}
