package e2e

import (
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/lab"
	"github.com/onehop/onehop/internal/testenv"
)

// Port-space isolation (issue 8): slivers share their host's public IPv4
// and MAC and are told apart by the ports they lease.

const portshare = `name: %s
hosts:
  - name: h1
  - name: h2
farms:
  - name: blue
    subnets:
      - name: web
vms:
  - {name: web1, host: h1, subnet: blue/web}
  - {name: web2, host: h2, subnet: blue/web}
slivers:
  - {name: s1, host: h1, ports: "10000-10099"}
  - {name: s2, host: h1, ports: "10100-10199"}
  - {name: s3, host: h2, ports: "10000-10099"}
externals:
  - {name: inet}
`

// addr is the first IPv4 address (without its length) of a node's
// interface.
func (l *testLab) addr(node, ifname string) string {
	l.t.Helper()
	for _, i := range l.node(node).Interfaces {
		if i.Name == ifname {
			for _, a := range i.Addrs {
				if ip, _, ok := strings.Cut(a, "/"); ok && !strings.Contains(ip, ":") {
					return ip
				}
			}
		}
	}
	l.t.Fatalf("node %s has no IPv4 address on %s", node, ifname)
	return ""
}

// nameServer answers on proto ("tcp" or "udp") port with the node's name:
// whoever answers is who the datapath delivered to.
const nameServer = `import socket,sys
proto,port,name=sys.argv[1],int(sys.argv[2]),sys.argv[3].encode()
if proto=="tcp":
    s=socket.socket(); s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)
    s.bind(("",port)); s.listen(16)
    while True:
        c,_=s.accept(); c.sendall(name); c.close()
else:
    s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM); s.bind(("",port))
    while True:
        d,a=s.recvfrom(2048); s.sendto(name,a)
`

// askName asks proto ip:port who it is, from node (source port sport, 0:
// any) and returns the answer.
const askName = `import socket,sys
proto,ip,port,sport=sys.argv[1],sys.argv[2],int(sys.argv[3]),int(sys.argv[4])
if proto=="tcp":
    s=socket.socket(); s.settimeout(2)
    if sport: s.bind(("",sport))
    s.connect((ip,port)); print(s.recv(64).decode())
else:
    s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM); s.settimeout(2)
    if sport: s.bind(("",sport))
    for _ in range(3):
        s.sendto(b"who",(ip,port))
        try:
            print(s.recvfrom(64)[0].decode()); break
        except socket.timeout: pass
    else: sys.exit("no answer")
`

func (l *testLab) serveName(node, proto string, port int) {
	l.t.Helper()
	l.start(node, "python3", "-c", nameServer, proto, fmt.Sprint(port), node)
	l.waitListening(node, proto, port)
}

func (l *testLab) whoIs(from, proto, ip string, port, sport int) (string, error) {
	out, err := l.in(from, "python3", "-c", askName, proto, ip, fmt.Sprint(port), fmt.Sprint(sport))
	return strings.TrimSpace(out), err
}

func TestPrivilegedExternalReachesEachSliverOnTheSharedAddressByPort(t *testing.T) {
	l := upLab(t, portshare)
	pub := l.addr("h1", "uplink0")
	if got := l.addr("s1", "eth0"); got != pub {
		t.Fatalf("s1's eth0 has %s, want the host's own %s", got, pub)
	}
	if got, want := l.mac("s1", "eth0"), l.mac("h1", "uplink0"); got != want {
		t.Fatalf("s1's eth0 has MAC %s, want the host's own %s", got, want)
	}
	for _, s := range []struct {
		node string
		port int
	}{{"s1", 10022}, {"s2", 10122}, {"h1", 5555}} {
		for _, proto := range []string{"tcp", "udp"} {
			l.serveName(s.node, proto, s.port)
		}
	}
	// Edges of the leases too: the first and last port of each.
	for _, s := range []struct {
		node string
		port int
	}{{"s1", 10000}, {"s1", 10099}, {"s2", 10100}, {"s2", 10199}} {
		l.serveName(s.node, "tcp", s.port)
	}
	for _, c := range []struct {
		proto string
		port  int
		want  string
	}{
		{"tcp", 10022, "s1"}, {"udp", 10022, "s1"},
		{"tcp", 10122, "s2"}, {"udp", 10122, "s2"},
		{"tcp", 5555, "h1"}, {"udp", 5555, "h1"}, // nobody leases it: the host's own
		{"tcp", 10000, "s1"}, {"tcp", 10099, "s1"}, {"tcp", 10100, "s2"}, {"tcp", 10199, "s2"},
	} {
		got, err := l.whoIs("inet", c.proto, pub, c.port, 0)
		if err != nil || got != c.want {
			t.Errorf("inet -> %s %s:%d answered by %q (%v), want %s", c.proto, pub, c.port, got, err, c.want)
		}
	}
	// The sliver's own connections out use its lease as source ports.
	l.serveName("inet", "tcp", 7000)
	out := l.mustIn("s1", "python3", "-c", `import socket,sys
s=socket.create_connection((sys.argv[1],7000)); print(s.getsockname()[1])`, l.addr("inet", "eth0"))
	var sport int
	if _, err := fmt.Sscan(strings.TrimSpace(out), &sport); err != nil || sport < 10000 || sport > 10099 {
		t.Errorf("s1's connection out used source port %q, want one of its lease 10000-10099", out)
	}
	// /metrics reads the counters live; the status record (onehop stats)
	// has them within its refresh interval.
	m := l.metrics("h1")
	for _, s := range []string{"s1", "s2"} {
		for _, dir := range []string{"in", "out"} {
			key := fmt.Sprintf(`onehop_sliver_packets_total{dir="%s",sliver="%s"}`, dir, s)
			if v := m.at(key); v == 0 {
				t.Errorf("%s = 0 after traffic both ways", key)
			}
		}
	}
	testenv.Eventually(t, "h1's status to count both slivers' traffic", 15*time.Second, func() error {
		l.refresh()
		st := l.node("h1").Agent
		if st == nil {
			return fmt.Errorf("h1's agent reported no status")
		}
		busy := 0
		for _, s := range st.Slivers {
			if (s.Name == "s1" || s.Name == "s2") && s.PacketsIn > 0 && s.PacketsOut > 0 {
				busy++
			}
		}
		if busy != 2 {
			return fmt.Errorf("slivers %+v", st.Slivers)
		}
		return nil
	})
}

// sliverCapture records what a sliver receives on eth0; live proves the
// capture records (a datagram from inet to a port of the sliver's lease)
// so that "nothing arrived" means something.
type sliverCapture struct {
	l      *testLab
	node   string
	port   int
	stop   func() []string
	alive  []string
	frames []string
}

func (l *testLab) captureSliver(node string, leasePort int) *sliverCapture {
	stop, _ := l.captureFile(node, "eth0", "ip.src", "icmp.type", "icmp.ident", "udp.dstport", "data.data")
	c := &sliverCapture{l: l, node: node, port: leasePort, stop: stop}
	c.live("start")
	return c
}

func (c *sliverCapture) live(phase string) {
	c.l.t.Helper()
	msg := fmt.Sprintf("alive-%s-%s", phase, c.node)
	c.alive = append(c.alive, hex.EncodeToString([]byte(msg)))
	c.l.sendUDPFrom("inet", c.l.addr(c.node, "eth0"), 0, c.port, 64, msg)
}

// finish proves the capture still live, stops it and returns its lines
// (tab-separated fields), having checked both proofs are among them.
func (c *sliverCapture) finish() []string {
	c.l.t.Helper()
	c.live("end")
	time.Sleep(300 * time.Millisecond) // let the end proof land before tcpdump stops
	c.frames = c.stop()
	all := strings.Join(c.frames, "\n")
	for _, a := range c.alive {
		if !strings.Contains(all, a) {
			c.l.t.Fatalf("the capture on %s never saw its liveness datagram %s: it proves nothing\n%s", c.node, a, all)
		}
	}
	return c.frames
}

func TestPrivilegedTwoSliversPingingOneRemoteEachGetOnlyTheirOwnReplies(t *testing.T) {
	l := upLab(t, portshare)
	inet := l.addr("inet", "eth0")
	c1, c2 := l.captureSliver("s1", 10009), l.captureSliver("s2", 10109)
	// s1 picks an id inside its lease; s2 one outside any lease (ping's
	// own choice is random), which the datapath rewrites into s2's lease
	// on the way out and back on the way in.
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, p := range []struct{ node, id string }{{"s1", "10050"}, {"s2", "7"}} {
		wg.Add(1)
		go func(i int, node, id string) {
			defer wg.Done()
			errs[i] = l.ping(node, inet, 10, "-e", id)
		}(i, p.node, p.id)
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("sliver %d: %v", i+1, err)
		}
	}
	// Echo requests to the shared address are the host's to answer:
	// the slivers must not see them.
	if err := l.ping("inet", l.addr("h1", "uplink0"), 3); err != nil {
		t.Errorf("inet pinging h1's address: %v", err)
	}
	check := func(c *sliverCapture, wantID string) {
		replies := 0
		for _, f := range c.finish() {
			fs := strings.Split(f, "\t")
			if len(fs) > 1 && fs[1] == "8" && strings.HasPrefix(fs[0], l.addr("inet", "eth0")) {
				t.Errorf("%s received inet's echo request to the shared address: %q", c.node, f)
			}
			if len(fs) < 3 || fs[1] != "0" { // echo replies only
				continue
			}
			replies++
			if id := fs[2]; id != wantID {
				t.Errorf("%s received an echo reply with id %s, want only its own %s: %q", c.node, id, wantID, f)
			}
		}
		if replies != 10 {
			t.Errorf("%s received %d echo replies, want exactly its own 10", c.node, replies)
		}
	}
	check(c1, "10050")
	check(c2, "7") // restored to what s2's ping chose
}

func TestPrivilegedPortUnreachableGoesBackToTheSenderOnly(t *testing.T) {
	l := upLab(t, portshare)
	inet := l.addr("inet", "eth0")
	c1, c2 := l.captureSliver("s1", 10009), l.captureSliver("s2", 10109)
	// Nothing listens on inet's 9999: inet's kernel answers port
	// unreachable, quoting s1's datagram from 10031.
	l.sendUDPFrom("s1", inet, 10031, 9999, 64, "nobody-home")
	time.Sleep(300 * time.Millisecond) // let the error come back before the captures stop
	unreachable := func(frames []string) int {
		n := 0
		for _, f := range frames {
			// An ICMP error carries two IP headers: tshark lists both
			// sources, the error's first.
			if fs := strings.Split(f, "\t"); len(fs) > 1 && strings.HasPrefix(fs[0], inet+",") && strings.HasPrefix(fs[1], "3") {
				n++
			}
		}
		return n
	}
	if n := unreachable(c1.finish()); n != 1 {
		t.Errorf("s1 received %d port unreachables for its datagram, want 1", n)
	}
	if n := unreachable(c2.finish()); n != 0 {
		t.Errorf("s2 received %d port unreachables meant for s1", n)
	}
}

func TestPrivilegedSliverFrameFromAForeignPortNeverReachesTheRemote(t *testing.T) {
	l := upLab(t, portshare)
	inet := l.addr("inet", "eth0")
	stop, _ := l.captureFile("inet", "eth0", "ip.src", "udp.srcport", "data.data")
	before := l.metrics("h1")
	// Positive control: the same datagram from s1's own port arrives.
	l.sendUDPFrom("s1", inet, 10077, 9000, 64, "from-own-port")
	// s2's port, through a raw socket (the kernel's checks do not apply).
	l.mustIn("s1", "python3", "-c", rawUDP, l.addr("s1", "eth0"), inet, "10150", "9000", "from-foreign-port")
	l.sendUDPFrom("s1", inet, 10078, 9000, 64, "from-own-port-after")
	time.Sleep(300 * time.Millisecond) // let the last one land
	all := strings.Join(stop(), "\n")
	for _, want := range []string{"from-own-port", "from-own-port-after"} {
		if !strings.Contains(all, hex.EncodeToString([]byte(want))) {
			t.Fatalf("inet never saw s1's %q: the capture proves nothing\n%s", want, all)
		}
	}
	if strings.Contains(all, hex.EncodeToString([]byte("from-foreign-port"))) {
		t.Errorf("inet received s1's datagram from s2's port 10150:\n%s", all)
	}
	after := l.metrics("h1")
	if d := rise(before, after, drops("ps_foreign_port")); d < 1 {
		t.Errorf("drops{ps_foreign_port} rose by %v, want the crafted frame counted", d)
	}
}

// rawUDP sends a UDP datagram built by hand (SRC DST SPORT DPORT PAYLOAD)
// through a raw IP socket, as a sliver's root could.
const rawUDP = `import socket,struct,sys
src,dst,sp,dp,body=sys.argv[1],sys.argv[2],int(sys.argv[3]),int(sys.argv[4]),sys.argv[5].encode()
u=struct.pack("!HHHH",sp,dp,8+len(body),0)+body
s=socket.socket(socket.AF_INET,socket.SOCK_RAW,socket.IPPROTO_UDP)
s.sendto(u,(dst,0))`

func TestPrivilegedBindOutsideTheLeaseFailsWithEPERM(t *testing.T) {
	l := upLab(t, portshare)
	bind := `import socket,sys
s=socket.socket(socket.AF_INET,getattr(socket,sys.argv[1]))
try:
    s.bind(("",int(sys.argv[2]))); print("bound")
except OSError as e: print("errno", e.errno)`
	for _, c := range []struct {
		typ  string
		port string
		want string
	}{
		{"SOCK_STREAM", "10050", "bound"}, {"SOCK_DGRAM", "10050", "bound"},
		{"SOCK_STREAM", "10150", "errno 1"}, {"SOCK_DGRAM", "10150", "errno 1"}, // s2's
		{"SOCK_STREAM", "80", "errno 1"}, {"SOCK_DGRAM", "5555", "errno 1"}, // the host's
	} {
		if got := strings.TrimSpace(l.mustIn("s1", "python3", "-c", bind, c.typ, c.port)); got != c.want {
			t.Errorf("s1: %s bind to %s: %q, want %q", c.typ, c.port, got, c.want)
		}
	}
}

func TestPrivilegedHairpinOnTheSharedAddressSteersByPort(t *testing.T) {
	l := upLab(t, portshare)
	pub := l.addr("h1", "uplink0")
	l.serveName("s1", "tcp", 10022)
	l.serveName("s2", "tcp", 10122)
	l.serveName("h1", "tcp", 5555)
	for _, c := range []struct{ from, want string }{
		{"s1", "s2"}, {"s2", "s1"}, {"h1", "s1"}, {"s1", "h1"},
	} {
		port := map[string]int{"s1": 10022, "s2": 10122, "h1": 5555}[c.want]
		got, err := l.whoIs(c.from, "tcp", pub, port, 0)
		if err != nil || got != c.want {
			t.Errorf("%s -> %s:%d answered by %q (%v), want %s", c.from, pub, port, got, err, c.want)
		}
	}
}

func TestPrivilegedLeaseChangeMovesPortsWithoutDisturbingOthers(t *testing.T) {
	l := upLab(t, portshare)
	pub := l.addr("h1", "uplink0")
	l.serveName("s1", "tcp", 10022)
	l.serveName("s1", "tcp", 10070)
	l.serveName("h1", "tcp", 10070)
	l.serveName("s2", "tcp", 10122)
	// A long connection into s2, which the change must not touch.
	l.start("s2", "python3", "-c", `import socket
s=socket.socket(); s.bind(("",10130)); s.listen(1)
c,_=s.accept()
while True:
    d=c.recv(64)
    if not d: break
    c.sendall(d)`)
	l.waitListening("s2", "tcp", 10130)
	echo := l.start("inet", "python3", "-u", "-c", `import socket,sys,time
s=socket.create_connection((sys.argv[1],10130))
for i in range(40):
    s.sendall(b"x"); print(s.recv(1).decode(), flush=True); time.sleep(0.1)
print("done")`, pub)

	if got, _ := l.whoIs("inet", "tcp", pub, 10070, 0); got != "s1" {
		t.Fatalf("before the change inet -> 10070 answered by %q, want s1", got)
	}
	// A connection into s1 on 10071, a port it is about to lose: it must
	// be cut (inet sees it end), not left to hang.
	l.start("s1", "python3", "-c", `import socket,time
s=socket.socket(); s.bind(("",10071)); s.listen(1)
c,_=s.accept(); time.sleep(60)`)
	l.waitListening("s1", "tcp", 10071)
	held := l.start("inet", "python3", "-u", "-c", `import socket,sys
s=socket.create_connection((sys.argv[1],10071)); print("open", flush=True)
try:
    d=s.recv(1); print("ended", d, flush=True)
except OSError as e: print("ended", e, flush=True)`, pub)
	testenv.Eventually(t, "inet's connection to s1:10071", 5*time.Second, func() bool { return strings.Contains(held.Output(), "open") })
	if out, err := l.cli("sliver", "set", "h1/s1", "--ports", "10000-10049"); err != nil {
		t.Fatalf("sliver set: %v\n%s", err, out)
	}
	testenv.Eventually(t, "10070 to reach the host once s1 lost it", 10*time.Second, func() error {
		if got, err := l.whoIs("inet", "tcp", pub, 10070, 0); got != "h1" {
			return fmt.Errorf("answered by %q (%v)", got, err)
		}
		return nil
	})
	if got, err := l.whoIs("inet", "tcp", pub, 10022, 0); got != "s1" {
		t.Errorf("after the change inet -> 10022 answered by %q (%v), want s1 (still its lease)", got, err)
	}
	testenv.Eventually(t, "s1's connection on lost port 10071 to be cut", 10*time.Second, func() bool {
		return strings.Contains(held.Output(), "ended")
	})
	testenv.Eventually(t, "h1's status to count the cut connection", 15*time.Second, func() error {
		l.refresh()
		if st := l.node("h1").Agent; st != nil {
			for _, s := range st.Slivers {
				if s.Name == "s1" && s.Cut >= 1 {
					return nil
				}
			}
			return fmt.Errorf("slivers %+v", st.Slivers)
		}
		return fmt.Errorf("no agent status")
	})
	testenv.Eventually(t, "the connection into s2 to finish", 15*time.Second, func() bool {
		return strings.Contains(echo.Output(), "done")
	})
	if n := strings.Count(echo.Output(), "x"); n != 40 {
		t.Errorf("the connection into s2 echoed %d of 40 bytes across s1's lease change:\n%s", n, echo.Output())
	}
}

func TestPrivilegedSliversAndVMsOnOneHostDoNotSeeEachOthersTraffic(t *testing.T) {
	l := upLab(t, portshare)
	c1 := l.captureSliver("s1", 10009)
	if err := l.ping("web1", l.ip("web2"), 3); err != nil {
		t.Fatal(err)
	}
	for _, f := range c1.finish() {
		if strings.HasPrefix(f, "10.") {
			t.Errorf("s1 received tenant traffic: %q", f)
		}
	}
	w := l.watchVM("web1", "web2")
	proveLive(t, "start", w)
	l.serveName("s1", "udp", 10022)
	if got, err := l.whoIs("inet", "udp", l.addr("h1", "uplink0"), 10022, 0); got != "s1" {
		t.Fatalf("inet -> s1 answered by %q (%v)", got, err)
	}
	stopWatches(t, w)
	for _, f := range w.frames {
		if !f.liveness() {
			t.Errorf("web1 received sliver traffic: %s", f)
		}
	}
}

const twoUplinks = `name: %s
hosts:
  - {name: h1, uplinks: 2}
slivers:
  - {name: s1, host: h1, ports: "10000-10099,1:20000-20099"}
  - {name: s2, host: h1, ports: "1:20100-20199"}
externals:
  - {name: inet}
`

func TestPrivilegedSliversLeasePortsOnEitherUplinkOfAMultiHomedHost(t *testing.T) {
	l := upLab(t, twoUplinks)
	a0, a1 := l.addr("h1", "uplink0"), l.addr("h1", "uplink1")
	if a0 == a1 {
		t.Fatalf("h1's two uplinks share the address %s", a0)
	}
	l.serveName("s1", "tcp", 10022)
	l.serveName("s1", "tcp", 20022)
	l.serveName("s2", "tcp", 20122)
	for _, c := range []struct {
		ip   string
		port int
		want string
	}{{a0, 10022, "s1"}, {a1, 20022, "s1"}, {a1, 20122, "s2"}} {
		if got, err := l.whoIs("inet", "tcp", c.ip, c.port, 0); got != c.want {
			t.Errorf("inet -> %s:%d answered by %q (%v), want %s", c.ip, c.port, got, err, c.want)
		}
	}
	// 20022 on the first uplink is nobody's lease there: not s1's.
	if got, _ := l.whoIs("inet", "tcp", a0, 20022, 0); got == "s1" {
		t.Errorf("inet -> %s:20022 reached s1, whose lease on 20000-20099 is on the other uplink", a0)
	}
}

// A sliver shares its host's address and reaches the host's own stack on
// every port it does not lease (the hairpin), so an agent serving /metrics
// on every address let a sliver read its neighbours' traffic counters
// (issue 20, item 15). The agent serves them on the host's loopback, which
// no guest and no node on the fabric can reach.
func TestPrivilegedASliverCannotReadItsHostsMetrics(t *testing.T) {
	l := upLab(t, portshare)
	pub := l.addr("h1", "uplink0")
	// Control: the operator on the host reads them, s2's counters in them.
	if n := l.metrics("h1").at(`onehop_sliver_packets_total{dir="in",sliver="s2"}`); n < 0 {
		t.Fatalf("s2's counter on h1 reads %v", n)
	}
	// Live control: s1 reaches a server of h1's own stack through the
	// hairpin, on the shared address.
	l.serveName("h1", "tcp", 5555)
	if got, err := l.whoIs("s1", "tcp", pub, 5555, 0); got != "h1" {
		t.Fatalf("s1 -> %s:5555 (h1's own server) answered by %q (%v): the hairpin is not working, the test proves nothing", pub, got, err)
	}
	// The attack: the metrics port on the shared address (and on s1's own
	// loopback, which is not the host's), from s1 and from a node on the
	// fabric. Refused at once (curl exit 7), not lost: h1's stack answers,
	// and nothing of it listens there.
	for _, from := range []string{"s1", "inet"} {
		for _, host := range []string{pub, "127.0.0.1"} {
			url := fmt.Sprintf("http://%s:%d/metrics", host, lab.MetricsPort)
			out, err := l.in(from, "curl", "-sS", "--max-time", "5", url)
			if err == nil {
				t.Errorf("%s read h1's metrics at %s:\n%.300s", from, url, out)
				continue
			}
			if !strings.Contains(out, "Connection refused") && !strings.Contains(out, "Couldn't connect") {
				t.Errorf("%s -> %s: %v, want the connection refused:\n%s", from, url, err, out)
			}
		}
	}
}
