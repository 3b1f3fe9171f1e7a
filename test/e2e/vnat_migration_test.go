package e2e

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/testenv"
	"github.com/onehop/onehop/internal/vcmp"
	"github.com/onehop/onehop/internal/vnatd"
)

// Connection migration (issue 10) end to end, beside vnat_daemon_test.go's
// TCP stream: a connected UDP flow, an external readdressed, a peer without
// a daemon, and a forged update from a third VM.

// vnatStatus is NODE's daemon's `onehop vnat status -o json`.
func (l *testLab) vnatStatus(node string) vnatd.Reply {
	l.t.Helper()
	var r vnatd.Reply
	out := l.mustIn(node, binary, "vnat", "status", "-o", "json")
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		l.t.Fatalf("%s: vnat status -o json: %v\n%s", node, err, out)
	}
	return r
}

// vnatConn is the connection named by its virtual tuple at node.
func (l *testLab) vnatConn(node, proto, virtual string) (vnatd.ConnStatus, bool) {
	l.t.Helper()
	for _, c := range l.vnatStatus(node).Conns {
		if c.Virtual == virtual && c.Proto == proto {
			return c, true
		}
	}
	return vnatd.ConnStatus{}, false
}

// waitOrSay is testenv.Eventually on ok that says more when it gives up:
// what diag returns (the programs' output, the daemons' logs), read then.
func waitOrSay(t *testing.T, what string, timeout time.Duration, ok func() bool, diag func() string) {
	t.Helper()
	testenv.Eventually(t, what, timeout, func() error {
		if ok() {
			return nil
		}
		return diagnosis(diag)
	})
}

// diagnosis is an error whose message is what diag returns when it is
// printed, not each time a check fails.
type diagnosis func() string

func (d diagnosis) Error() string { return "\n" + d() }

// udpEchoServer answers every datagram on UDP 7200 from a socket connected
// to its first client: a connected UDP socket at each end. An error (an
// ICMP port unreachable reported on a connected socket) is printed and
// the loop goes on, as a UDP application's would.
const udpEchoServer = `
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", 7200))
print("listening", flush=True)
data, peer = s.recvfrom(2048)
s.connect(peer)
s.send(data)
while True:
    try:
        s.send(s.recv(2048))
    except OSError as e:  # a port unreachable while the ends were apart: UDP goes on
        print("recv/send: %s" % e, flush=True)
`

// udpEchoClient sends "line N" every 100 ms from a connected UDP socket
// and prints "echo N" for each answer; a datagram lost is sent again
// (UDP), send and receive errors while the ends are apart are waited out,
// 30 s without an answer ends it with "error".
const udpEchoClient = `
import socket, sys, time
c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
c.connect((sys.argv[1], 7200))
print("local %s:%d" % c.getsockname(), flush=True)
c.settimeout(0.5)
n, last = 1, time.time()
while True:
    try:
        c.send(b"line %d" % n)
        if c.recv(2048) == b"line %d" % n:
            print("echo %d" % n, flush=True)
            n, last = n + 1, time.time()
            time.sleep(0.1)
    except OSError as e:  # a timeout, or no route/address while moving: UDP goes on
        if not isinstance(e, socket.timeout):
            time.sleep(0.1)
        if time.time() - last > 30:
            print("error: no answer for 30 s", flush=True)
            break
`

// A connected UDP flow survives its client moving to another subnet: the
// daemons find it with sock_diag, translate it both ways, and the same
// socket keeps getting its echoes.
func TestPrivilegedVNATConnectedUDPFlowSurvivesASubnetMove(t *testing.T) {
	testenv.RequireTool(t, "udhcpc", "python3")
	l := upLab(t, vnatPair)
	server := l.start("db1", "python3", "-c", udpEchoServer)
	testenv.Eventually(t, "db1's UDP echo server", 10*time.Second, func() bool { return strings.Contains(server.Output(), "listening") })
	client := l.start("web1", "python3", "-c", udpEchoClient, l.ip("db1"))
	testenv.Eventually(t, "UDP echoes before the move", 15*time.Second, func() bool { return lastEcho(client.Output()) >= 5 })
	local := strings.TrimSpace(strings.TrimPrefix(strings.SplitN(client.Output(), "\n", 2)[0], "local "))
	virt := local + "->" + l.ip("db1") + ":7200"
	testenv.Eventually(t, "the UDP flow keyed at first contact on both ends", 20*time.Second, func() bool {
		a, okA := l.vnatConn("web1", "udp", virt)
		b, okB := l.vnatConn("db1", "udp", l.ip("db1")+":7200->"+local)
		return okA && okB && a.Keyed && b.Keyed
	})

	l.onehop("lab", "move", "web1", "--to", "h2", "--subnet", "blue/db")
	l.refresh()
	newIP := l.node("web1").VM.IP
	before := lastEcho(client.Output())
	waitOrSay(t, "20 more UDP echoes after the move", 40*time.Second, func() bool {
		return lastEcho(client.Output()) >= before+20 || strings.Contains(client.Output(), "error")
	}, func() string {
		return "client:\n" + lastLines(client.Output(), 5) + "\nserver:\n" + lastLines(server.Output(), 5) + "\n" + vnatLogs(l)
	})
	if strings.Contains(client.Output(), "error") {
		t.Fatalf("the UDP flow stopped across the move:\n%s\n%s", lastLines(client.Output(), 3), vnatLogs(l))
	}
	port := local[strings.LastIndexByte(local, ':'):]
	if c, ok := l.vnatConn("web1", "udp", virt); !ok || c.State != "migrated" || !strings.HasPrefix(c.Physical, newIP+port+"->") {
		t.Errorf("web1's status of udp %s: %+v (found %v), want migrated from %s%s", virt, c, ok, newIP, port)
	}
	if c, ok := l.vnatConn("db1", "udp", l.ip("db1")+":7200->"+local); !ok || c.State != "migrated" || !strings.HasSuffix(c.Physical, "->"+newIP+port) {
		t.Errorf("db1's status of the UDP flow: %+v (found %v), want migrated to %s%s", c, ok, newIP, port)
	}
}

const vnatExternals = `name: %s
hosts: [{name: h1}]
externals:
  - {name: x1, vnat: true}
  - {name: x2, vnat: true}
`

// extIP is an external's first eth0 address, without its prefix.
func (l *testLab) extIP(node string) string {
	l.t.Helper()
	for _, i := range l.node(node).Interfaces {
		if i.Name == "eth0" && len(i.Addrs) > 0 {
			a, _, _ := strings.Cut(i.Addrs[0], "/")
			return a
		}
	}
	l.t.Fatalf("external %s has no address on eth0", node)
	return ""
}

// An external with vnat: true keeps its TCP connection when `lab readdress`
// gives it a new fabric address.
func TestPrivilegedVNATExternalKeepsItsConnectionAcrossReaddress(t *testing.T) {
	testenv.RequireTool(t, "python3")
	l := upLab(t, vnatExternals)
	server := l.start("x2", "python3", "-c", echoServer)
	testenv.Eventually(t, "x2's echo server", 10*time.Second, func() bool { return strings.Contains(server.Output(), "listening") })
	x2 := l.extIP("x2")
	client := l.start("x1", "python3", "-c", echoClient, x2)
	testenv.Eventually(t, "echoes before the readdress", 15*time.Second, func() bool { return lastEcho(client.Output()) >= 5 })
	local := strings.TrimSpace(strings.TrimPrefix(strings.SplitN(client.Output(), "\n", 2)[0], "local "))
	virt := local + "->" + x2 + ":7100"
	testenv.Eventually(t, "the connection keyed at first contact", 20*time.Second, func() bool {
		c, ok := l.vnatConn("x1", "tcp", virt)
		return ok && c.Keyed
	})
	old := l.extIP("x1")
	l.onehop("lab", "readdress", "x1")
	l.refresh()
	fresh := l.extIP("x1")
	if fresh == old {
		t.Fatalf("readdress left x1 at %s", old)
	}
	before := lastEcho(client.Output())
	testenv.Eventually(t, "20 more echoes after the readdress", 40*time.Second, func() bool {
		return lastEcho(client.Output()) >= before+20 || strings.Contains(client.Output(), "error")
	})
	if strings.Contains(client.Output(), "error") {
		t.Fatalf("the connection broke across the readdress:\n%s\n%s", lastLines(client.Output(), 3), l.mustIn("x1", binary, "vnat", "status"))
	}
	port := local[strings.LastIndexByte(local, ':'):]
	if c, ok := l.vnatConn("x1", "tcp", virt); !ok || c.State != "migrated" || c.Physical != fresh+port+"->"+x2+":7100" {
		t.Errorf("x1's status of %s: %+v (found %v), want migrated as %s%s->%s:7100", virt, c, ok, fresh, port, x2)
	}
	r := l.vnatStatus("x1")
	if r.Restore == nil || r.Restore.Old != old || r.Restore.New != fresh || r.Restore.Migrated < 1 {
		t.Errorf("x1's restore report %+v, want %s -> %s with the connection migrated", r.Restore, old, fresh)
	}
}

const vnatOneSided = `name: %s
hosts: [{name: h1}, {name: h2}, {name: h3}]
farms:
  - name: blue
    subnets: [{name: web}, {name: db}, {name: app}]
    rules: [{from: web, to: db}, {from: db, to: web}, {from: db, to: app}, {from: app, to: db}]
vms:
  - {name: web1, host: h1, subnet: blue/web, vnat: true}
  - {name: db1, host: h3, subnet: blue/db}
`

// A peer without a VNAT daemon cannot be told where the moved end went:
// the mover's daemon finds nobody on the peer's port 2031, aborts the
// connection's migration and says why (status, counter, restore report,
// log); the connection does not carry on, though the network between the
// two works (proven by a ping at the new address).
func TestPrivilegedVNATPeerWithoutDaemonCannotBeRestoredAndTheDaemonSaysWhy(t *testing.T) {
	testenv.RequireTool(t, "udhcpc", "python3")
	l := upLab(t, vnatOneSided)
	server := l.start("db1", "python3", "-c", echoServer)
	testenv.Eventually(t, "db1's echo server", 10*time.Second, func() bool { return strings.Contains(server.Output(), "listening") })
	client := l.start("web1", "python3", "-c", echoClient, l.ip("db1"))
	testenv.Eventually(t, "echoes before the move", 15*time.Second, func() bool { return lastEcho(client.Output()) >= 5 })
	local := strings.TrimSpace(strings.TrimPrefix(strings.SplitN(client.Output(), "\n", 2)[0], "local "))
	virt := local + "->" + l.ip("db1") + ":7100"
	testenv.Eventually(t, "web1's daemon sees the connection", 10*time.Second, func() bool {
		c, ok := l.vnatConn("web1", "tcp", virt)
		return ok && c.State == "active" && !c.Keyed // no daemon at db1 to key it with
	})
	if _, err := l.in("db1", binary, "vnat", "status"); err == nil {
		t.Fatal("db1 answers vnat status: it has a daemon, the test needs a peer without one")
	}

	l.onehop("lab", "move", "web1", "--to", "h2", "--subnet", "blue/app")
	l.refresh()
	// The walk is retried for 15 s before the migration is aborted.
	testenv.Eventually(t, "web1's daemon to abort the connection's migration", 40*time.Second, func() bool {
		c, ok := l.vnatConn("web1", "tcp", virt)
		return ok && c.State == "aborted"
	})
	r := l.vnatStatus("web1")
	if r.Counters["aborted"] < 1 {
		t.Errorf("web1's counters %v, want aborted >= 1", r.Counters)
	}
	if r.Restore == nil || r.Restore.Aborted < 1 || r.Restore.Migrated != 0 {
		t.Errorf("web1's restore report %+v, want the connection aborted, none migrated", r.Restore)
	}
	logs := vnatLogs(l)
	if !strings.Contains(logs, "vnat: place unreachable") || !strings.Contains(logs, l.ip("db1")) {
		t.Errorf("web1's daemon log does not say it could not reach db1's daemon:\n%s", logs)
	}
	// The network is fine (web1 reaches db1 from its new address); the
	// connection is not: no echo comes back any more.
	if err := l.ping("web1", l.ip("db1"), 3); err != nil {
		t.Fatalf("web1 cannot reach db1 after the move (the test would prove nothing): %v", err)
	}
	stalled := lastEcho(client.Output())
	time.Sleep(3 * time.Second) // a window in which 30 echoes would come back on a live connection
	if got := lastEcho(client.Output()); got != stalled {
		t.Errorf("echoes went on after the move without VNAT at db1 (%d -> %d): the connection was not expected to survive", stalled, got)
	}
}

const vnatWithRogue = vnatPair + `  - {name: rogue, host: h2, subnet: blue/web}
`

// A forged VNAT_UPD from a third VM cannot redirect a connection: rogue
// sends db1's daemon updates claiming web1 moved to rogue's address, one
// unsealed and one sealed with a key of its own; both are refused
// (answered, counted, logged), the connection stays where it is and keeps
// echoing, and a capture on rogue (live: it records db1's answers to
// rogue's own VCMP stream) holds not one packet of the connection.
func TestPrivilegedVNATForgedUpdateFromAThirdVMIsRefusedAndTheConnectionCarriesOn(t *testing.T) {
	testenv.RequireTool(t, "udhcpc", "python3", "tcpdump", "tshark")
	l := upLab(t, vnatWithRogue)
	server := l.start("db1", "python3", "-c", echoServer)
	testenv.Eventually(t, "db1's echo server", 10*time.Second, func() bool { return strings.Contains(server.Output(), "listening") })
	db := l.ip("db1")
	client := l.start("web1", "python3", "-c", echoClient, db)
	testenv.Eventually(t, "echoes before the attack", 15*time.Second, func() bool { return lastEcho(client.Output()) >= 5 })
	local := strings.TrimSpace(strings.TrimPrefix(strings.SplitN(client.Output(), "\n", 2)[0], "local "))
	virtDB := db + ":7100->" + local
	testenv.Eventually(t, "the connection keyed at first contact", 20*time.Second, func() bool {
		c, ok := l.vnatConn("db1", "tcp", virtDB)
		return ok && c.Keyed && c.State == "active"
	})

	// The forged updates, as web1 would send them (the connection seen
	// from web1), putting web1 at rogue's address.
	conn := vcmp.Tuple{Proto: vcmp.TCP, Local: netip.MustParseAddrPort(local), Remote: netip.MustParseAddrPort(db + ":7100")}
	upd := &vcmp.Update{Record: vcmp.Record{Conn: conn, Phys: netip.AddrPortFrom(netip.MustParseAddr(l.ip("rogue")), 40000)}}
	var key vcmp.Secret
	if _, err := rand.Read(key[:]); err != nil {
		t.Fatal(err)
	}
	sealed, err := vcmp.Seal(upd, key, 1)
	if err != nil {
		t.Fatal(err)
	}
	batches, err := vcmp.Batches([]vcmp.Message{upd, sealed})
	if err != nil {
		t.Fatal(err)
	}
	var wire []byte
	for _, b := range batches {
		enc, err := vcmp.Encode(b)
		if err != nil {
			t.Fatal(err)
		}
		wire = append(wire, enc...)
	}
	const send = `
import socket, sys
s = socket.create_connection((sys.argv[1], 2031), timeout=10)
print(s.getsockname()[1])
s.sendall(bytes.fromhex(sys.argv[2])); s.shutdown(socket.SHUT_WR)
out = b""
while True:
    b = s.recv(65536)
    if not b: break
    out += b
print(out.hex())
`
	stop, _ := l.captureFile("rogue", "eth0", "ip.src", "ip.dst", "tcp.srcport", "tcp.dstport", "udp.srcport", "udp.dstport")
	before := l.vnatStatus("db1").Counters
	// answers sends the forged updates once and returns db1's answers and
	// the port rogue sent them from.
	answers := func() ([]vcmp.Message, string) {
		port, out, _ := strings.Cut(strings.TrimSpace(l.mustIn("rogue", "python3", "-c", send, db, hex.EncodeToString(wire))), "\n")
		raw, err := hex.DecodeString(strings.TrimSpace(out))
		if err != nil {
			t.Fatalf("rogue's answer %q: %v", out, err)
		}
		var got []vcmp.Message
		for r := bytes.NewReader(raw); r.Len() > 0; {
			m, err := vcmp.ReadMessage(r)
			if err != nil {
				t.Fatalf("db1's answer to rogue: %v", err)
			}
			b, ok := m.(*vcmp.Batch)
			if !ok {
				t.Fatalf("db1's answer to rogue: %s, want a batch", m.Command())
			}
			got = append(got, b.Entries...)
		}
		return got, port
	}
	got, _ := answers()
	if len(got) != 2 {
		t.Fatalf("db1 answered %d messages to rogue's 2", len(got))
	}
	for i, m := range got {
		r, ok := m.(*vcmp.UpdateReply)
		if !ok || r.Status != vcmp.UpdateRefused {
			t.Errorf("db1's answer %d to rogue's forged update: %#v, want VNAT_UPD_R refused", i, m)
		}
	}
	// The connection is where it was, and carries on.
	n := lastEcho(client.Output())
	testenv.Eventually(t, "10 more echoes after the attack", 20*time.Second, func() bool {
		return lastEcho(client.Output()) >= n+10 || strings.Contains(client.Output(), "error")
	})
	if strings.Contains(client.Output(), "error") {
		t.Fatalf("the connection broke after the forged updates:\n%s\n%s", lastLines(client.Output(), 3), vnatLogs(l))
	}
	if c, ok := l.vnatConn("db1", "tcp", virtDB); !ok || c.State != "active" || c.Physical != virtDB {
		t.Errorf("db1's status of %s after the attack: %+v (found %v), want active, untranslated", virtDB, c, ok)
	}
	after := l.vnatStatus("db1").Counters
	refused := 0.0
	for _, k := range []string{"refused_forged", "refused_unkeyed", "refused_nokey"} {
		refused += float64(after[k]) - float64(before[k])
	}
	if _, ok := after["refused_forged"]; !ok || after["refused_forged"] <= before["refused_forged"] || refused < 2 {
		t.Errorf("db1's refusal counters before %v after %v: want the sealed forgery counted as refused_forged and both refused", before, after)
	}
	if logs := vnatLogs(l); !strings.Contains(logs, "vnat: update refused") {
		t.Errorf("db1's daemon did not log the refusal:\n%s", logs)
	}
	// A second try after the echoes: the capture is still live at the end.
	_, lastPort := answers()
	lines := stop()
	streams := map[string]bool{} // rogue's ports of db1's VCMP answers: one per try
	for _, line := range lines {
		f := strings.Split(line, "\t")
		if len(f) < 4 {
			continue
		}
		if f[0] == db && f[2] == "2031" {
			streams[f[3]] = true
		}
		if f[2] == "7100" || f[3] == "7100" {
			t.Errorf("rogue received a packet of the connection: %s", line)
		}
	}
	// The capture began before the first try; the last try's answers in
	// it prove it was live through the whole attack and the echoes after.
	if !streams[lastPort] {
		t.Fatalf("the capture on rogue lacks db1's VCMP answers to the last try (rogue's port %s; saw %v): it proves nothing\n%s", lastPort, streams, strings.Join(lines, "\n"))
	}
}

// An interactive program keeps its session across a move: socat on web1
// connects a shell loop to db1's echo server, and the loop behaves as a
// user at a terminal would: it types a line, waits for the answer, prints
// it, pauses. web1 moves to another subnet and the same session goes on,
// its connection migrated. (socat alone, one process with its loop as a
// child: when the test stops it, the loop reads EOF and ends, so nothing
// outlives it holding the test's pipes.)
func TestPrivilegedVNATInteractiveSocatSessionSurvivesAMove(t *testing.T) {
	testenv.RequireTool(t, "udhcpc", "socat", "python3")
	l := upLab(t, vnatPair)
	server := l.start("db1", "python3", "-c", echoServer)
	testenv.Eventually(t, "db1's echo server", 10*time.Second, func() bool { return strings.Contains(server.Output(), "listening") })
	db := l.ip("db1")
	const typist = `i=0; while [ $i -lt 100000 ]; do i=$((i+1)); echo echo $i; read r || exit 1; echo $r >&2; sleep 0.1; done`
	client := l.start("web1", "socat", "SYSTEM:"+typist, "TCP:"+db+":7100")
	testenv.Eventually(t, "echoes before the move", 15*time.Second, func() bool { return lastEcho(client.Output()) >= 5 })
	var virt string
	testenv.Eventually(t, "the session keyed at first contact", 20*time.Second, func() bool {
		for _, c := range l.vnatStatus("web1").Conns {
			if c.Proto == "tcp" && strings.HasSuffix(c.Virtual, "->"+db+":7100") && c.Keyed {
				virt = c.Virtual
				return true
			}
		}
		return false
	})
	l.onehop("lab", "move", "web1", "--to", "h2", "--subnet", "blue/db")
	l.refresh()
	newIP := l.node("web1").VM.IP
	before := lastEcho(client.Output())
	waitOrSay(t, "20 more echoes after the move", 40*time.Second, func() bool { return lastEcho(client.Output()) >= before+20 },
		func() string { return "client:\n" + lastLines(client.Output(), 5) + "\n" + vnatLogs(l) })
	if c, ok := l.vnatConn("web1", "tcp", virt); !ok || c.State != "migrated" || !strings.HasPrefix(c.Physical, newIP+":") {
		t.Errorf("web1's status of %s after the move: %+v (found %v), want migrated from %s", virt, c, ok, newIP)
	}
}
