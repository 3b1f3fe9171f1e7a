package e2e

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/testenv"
)

// Virtual TAP (issue 9): copies of what a policy names reach its monitor VM,
// on the sender's host or another, and nobody else.

const tapLab = `name: %s
hosts:
  - name: h1
  - name: h2
farms:
  - name: blue
    subnets:
      - name: web
      - name: db
    rules:
      - {from: web, to: db}
  - name: red
    subnets:
      - name: ops
vms:
  - {name: web1, host: h1, subnet: blue/web}
  - {name: web2, host: h2, subnet: blue/web}
  - {name: mon1, host: h1, subnet: blue/web}
  - {name: mon2, host: h2, subnet: blue/db}
  - {name: db1, host: h2, subnet: blue/db}
  - {name: ops1, host: h1, subnet: red/ops}
`

// tap runs `onehop tap ARGS` against the lab's controller.
func (l *testLab) tap(args ...string) {
	l.t.Helper()
	if out, err := l.cli(append([]string{"tap"}, args...)...); err != nil {
		l.t.Fatalf("onehop tap %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// awaitCopies sends probe datagrams from -> to:port until every watch has
// one (a policy reaches every host within a second; the probes prove it did
// for these monitors).
func (l *testLab) awaitCopies(from, to string, port int, ws ...*watch) {
	l.t.Helper()
	n := 0
	testenv.Eventually(l.t, "the TAP policy to reach the monitors' hosts", 5*time.Second, func() error {
		n++
		probe := fmt.Sprintf("probe-%d", n)
		l.sendUDPFrom(from, l.ip(to), 0, port, 64, probe)
		time.Sleep(100 * time.Millisecond) // let the copy land before looking
		for _, w := range ws {
			if !w.saw(probe) {
				return fmt.Errorf("%s has not seen %s", w.node, probe)
			}
		}
		return nil
	})
}

// udpPayloads counts the frames of ws whose UDP payload starts with prefix,
// by payload, checking each is from src to dst:dport.
func udpPayloads(t *testing.T, w *watch, prefix, src, dst, dport string) map[string]int {
	t.Helper()
	got := map[string]int{}
	for _, f := range w.frames {
		if !strings.HasPrefix(f.payload, prefix) {
			continue
		}
		got[f.payload]++
		if f.ipSrc != src || f.ipDst != dst || f.dport != dport {
			t.Errorf("%s received %q as %s -> %s:%s, want the original %s -> %s:%s", w.node, f.payload, f.ipSrc, f.ipDst, f.dport, src, dst, dport)
		}
	}
	return got
}

func TestPrivilegedTapCopiesExactlyTheMatchingPacketsToLocalAndRemoteMonitors(t *testing.T) {
	l := upLab(t, tapLab)
	web1, web2 := l.ip("web1"), l.ip("web2")
	mon1, mon2 := l.watchVM("mon1", "web1"), l.watchVM("mon2", "db1")
	recv := l.watchVM("web2", "web1")
	fabric := l.watchFabric("web1", "web2")
	proveLive(t, "start", mon1, mon2, recv, fabric)

	// mon1 sits on the sender's host, mon2 on another host (and subnet).
	l.tap("create", "t-local", "--sender", "blue/web/web1", "--receiver", "blue/web/web2", "--monitor", "blue/web/mon1", "--proto", "udp", "--dport", "7000")
	l.tap("create", "t-remote", "--sender", web1, "--receiver", "blue/web/web2", "--monitor", "blue/db/mon2", "--proto", "udp", "--dport", "7000-7000")
	l.awaitCopies("web1", "web2", 7000, mon1, mon2)

	for i := 0; i < 5; i++ {
		l.sendUDPFrom("web1", web2, 0, 7000, 64, fmt.Sprintf("match-%d", i))
	}
	for i := 0; i < 3; i++ {
		l.sendUDPFrom("web1", web2, 0, 7001, 64, fmt.Sprintf("nomatch-%d", i)) // another port
		l.sendUDPFrom("web2", web1, 0, 7000, 64, fmt.Sprintf("reverse-%d", i)) // the other direction
	}
	if err := l.ping("web1", web2, 2); err != nil { // another protocol
		t.Fatal(err)
	}
	stopWatches(t, mon1, mon2, recv, fabric)

	for _, w := range []*watch{mon1, mon2} {
		got := udpPayloads(t, w, "match-", web1, web2, "7000")
		for i := 0; i < 5; i++ {
			if n := got[fmt.Sprintf("match-%d", i)]; n != 1 {
				t.Errorf("%s received match-%d %d times, want exactly one copy", w.node, i, n)
			}
		}
		for _, f := range w.frames {
			if strings.HasPrefix(f.payload, "nomatch-") || strings.HasPrefix(f.payload, "reverse-") || f.icmpType == "8" {
				t.Errorf("%s received a packet no policy matches: %s", w.node, f)
			}
		}
	}
	// The receiver gets each packet once, as without any policy.
	got := udpPayloads(t, recv, "match-", web1, web2, "7000")
	for i := 0; i < 5; i++ {
		if n := got[fmt.Sprintf("match-%d", i)]; n != 1 {
			t.Errorf("web2 received match-%d %d times, want once", i, n)
		}
	}
	// On the fabric: host MACs and plain IPv4 or ARP only; each matching
	// datagram crosses twice (to web2, and its copy to mon2's host), the
	// others once.
	hostMACs := map[string]bool{l.mac("h1", "uplink0"): true, l.mac("h2", "uplink0"): true}
	crossings := map[string]int{}
	for _, f := range fabric.frames {
		if f.ethType != "0x0800" && f.ethType != "0x0806" {
			t.Errorf("the fabric carried a frame that is not plain IPv4 or ARP: %s", f)
		}
		if f.ethType == "0x0800" && f.ipSrc == web1 && (!hostMACs[f.ethSrc] || !hostMACs[f.ethDst]) {
			t.Errorf("web1's traffic crossed the fabric between %s and %s, not host MACs: %s", f.ethSrc, f.ethDst, f)
		}
		// web2's port unreachables quote the datagrams (nothing listens):
		// only what web1 sent counts.
		if f.ipSrc == web1 && f.icmpType == "" {
			crossings[f.payload]++
		}
	}
	for i := 0; i < 5; i++ {
		if n := crossings[fmt.Sprintf("match-%d", i)]; n != 2 {
			t.Errorf("match-%d crossed the fabric %d times, want 2 (production and one copy)", i, n)
		}
	}
	for i := 0; i < 3; i++ {
		if n := crossings[fmt.Sprintf("nomatch-%d", i)]; n != 1 {
			t.Errorf("nomatch-%d crossed the fabric %d times, want once (no copy)", i, n)
		}
	}
}

func TestPrivilegedTapCopiesATCPTransferAndPingsByteForByte(t *testing.T) {
	l := upLab(t, tapLab)
	web1, web2 := l.ip("web1"), l.ip("web2")
	l.tap("create", "t-tcp", "--sender", "blue/web/web1", "--receiver", "blue/web/web2", "--monitor", "blue/db/mon2", "--proto", "tcp", "--dport", "8080")
	l.tap("create", "t-icmp", "--sender", "blue/web/web1", "--receiver", "blue/web", "--monitor", "blue/web/mon1", "--proto", "icmp")
	// Captures of the flow on the receiver and on the monitors, all
	// directions: the receiver's view is what the monitor must match.
	stopRecv, _ := l.captureFile("web2", "eth0", "ip.src", "ip.dst", "tcp.srcport", "tcp.dstport", "tcp.len", "tcp.payload", "icmp.type", "tcp.seq_raw")
	stopMon2, _ := l.captureFile("mon2", "eth0", "ip.src", "ip.dst", "tcp.srcport", "tcp.dstport", "tcp.len", "tcp.payload", "icmp.type", "tcp.seq_raw")
	stopMon1, _ := l.captureFile("mon1", "eth0", "ip.src", "ip.dst", "tcp.srcport", "tcp.dstport", "tcp.len", "tcp.payload", "icmp.type", "tcp.seq_raw")
	testenv.Eventually(t, "the policies on h1", 5*time.Second, func() error {
		l.refresh()
		if st := l.node("h1").Agent; st != nil && len(st.Taps) >= 2 {
			return nil
		}
		return fmt.Errorf("h1 reports no TAP rules yet")
	})

	l.start("web2", "python3", "-c", `import socket
s=socket.socket(); s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1); s.bind(("",8080)); s.listen(1)
c,_=s.accept(); n=0
while True:
    d=c.recv(65536)
    if not d: break
    n+=len(d)
c.sendall(str(n).encode())`)
	l.waitListening("web2", "tcp", 8080)
	const size = 200000
	out := l.mustIn("web1", "python3", "-c", `import socket,sys
s=socket.create_connection((sys.argv[1],8080)); s.sendall(bytes(i%251 for i in range(int(sys.argv[2]))))
s.shutdown(socket.SHUT_WR); print(s.recv(64).decode())`, web2, fmt.Sprint(size))
	if strings.TrimSpace(out) != fmt.Sprint(size) {
		t.Fatalf("web2 received %q bytes, want %d", out, size)
	}
	if err := l.ping("web1", web2, 4); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // let the last copies land before the captures stop
	recv, mon2, mon1 := stopRecv(), stopMon2(), stopMon1()

	// The segments web1 sent to web2:8080, per view, in sequence order:
	// a copy crosses the fabric apart from its original, so the two may
	// arrive in another order.
	flow := func(lines []string) (segments int, payload string) {
		type segment struct {
			seq     uint64
			payload string
		}
		var segs []segment
		for _, line := range lines {
			f := strings.Split(line, "\t")
			if len(f) < 8 || f[0] != web1 || f[1] != web2 || f[3] != "8080" {
				continue
			}
			seq, err := strconv.ParseUint(f[7], 10, 32)
			if err != nil {
				t.Fatalf("tcp.seq_raw %q in %q: %v", f[7], line, err)
			}
			segs = append(segs, segment{seq, strings.ReplaceAll(f[5], ":", "")})
		}
		sort.SliceStable(segs, func(i, j int) bool { return segs[i].seq < segs[j].seq })
		var b strings.Builder
		for _, sg := range segs {
			b.WriteString(sg.payload)
		}
		return len(segs), b.String()
	}
	rs, rp := flow(recv)
	ms, mp := flow(mon2)
	if len(rp) < 2*size {
		t.Fatalf("the receiver's capture holds %d payload bytes of the transfer, want %d: the capture proves nothing", len(rp)/2, size)
	}
	if ms != rs || mp != rp {
		t.Errorf("mon2 saw %d segments (%d bytes) of web1 -> web2:8080, the receiver %d (%d bytes): want the same packets", ms, len(mp)/2, rs, len(rp)/2)
	}
	for _, line := range mon2 {
		if f := strings.Split(line, "\t"); len(f) > 3 && f[0] == web2 {
			t.Errorf("mon2 received a packet of the other direction (the policy is one-way): %q", line)
		}
	}
	echo := 0
	for _, line := range mon1 {
		f := strings.Split(line, "\t")
		if len(f) > 6 && f[0] == web1 && f[1] == web2 && f[6] == "8" {
			echo++
		}
		if len(f) > 3 && f[3] == "8080" {
			t.Errorf("mon1 (ICMP policy) received TCP: %q", line)
		}
	}
	if echo != 4 {
		t.Errorf("mon1 received %d of web1's 4 echo requests to web2", echo)
	}
}

func TestPrivilegedForgedCopyMarkerFromAVMNeverArrives(t *testing.T) {
	l := upLab(t, tapLab)
	web2 := l.ip("web2")
	w := l.watchVM("web2", "web1")
	proveLive(t, "start", w)
	before := l.metrics("h1")
	// IPv4 with the reserved flag (what marks a copy on the fabric), built
	// by hand with IP_HDRINCL.
	l.mustIn("web1", "python3", "-c", `import socket,struct,sys
src,dst=sys.argv[1],sys.argv[2]
body=b"forged-copy"
udp=struct.pack("!HHHH",5555,7000,8+len(body),0)+body
def csum(b):
    s=sum(struct.unpack("!10H",b)); s=(s>>16)+(s&0xffff); s+=s>>16; return ~s&0xffff
h=struct.pack("!BBHHHBBH4s4s",0x45,0,20+len(udp),1,0x8000,64,17,0,socket.inet_aton(src),socket.inet_aton(dst))
h=h[:10]+struct.pack("!H",csum(h))+h[12:]
s=socket.socket(socket.AF_INET,socket.SOCK_RAW,socket.IPPROTO_RAW)
s.sendto(h+udp,(dst,0))`, l.ip("web1"), web2)
	stopWatches(t, w)
	for _, f := range w.frames {
		if f.payload == "forged-copy" {
			t.Errorf("web2 received web1's frame carrying the copy marker: %s", f)
		}
	}
	if d := rise(before, l.metrics("h1"), drops("reserved_flag")); d < 1 {
		t.Errorf("drops{reserved_flag} rose by %v, want the forged marker counted", d)
	}
}

func TestPrivilegedTapDeleteStopsCopiesAndMovesKeepPolicies(t *testing.T) {
	l := upLab(t, tapLab)
	web2 := l.ip("web2")
	l.tap("create", "t1", "--sender", "blue/web/web1", "--receiver", "blue/web/web2", "--monitor", "blue/db/mon2", "--proto", "udp")
	mon2 := l.watchVM("mon2", "db1")
	proveLive(t, "start", mon2)
	l.awaitCopies("web1", "web2", 7000, mon2)

	// The monitor moves to the sender's host: copies follow it.
	l.onehop("lab", "move", "mon2", "--to", "h1")
	stopWatches(t, mon2)
	mon2 = l.watchVM("mon2", "db1")
	proveLive(t, "moved", mon2)
	l.awaitCopies("web1", "web2", 7000, mon2)

	l.tap("delete", "t1")
	testenv.Eventually(t, "no TAP rule left on any host", 5*time.Second, func() error {
		l.refresh()
		for _, h := range []string{"h1", "h2"} {
			if st := l.node(h).Agent; st == nil || len(st.Taps) != 0 {
				return fmt.Errorf("%s still reports TAP rules", h)
			}
		}
		return nil
	})
	for i := 0; i < 3; i++ {
		l.sendUDPFrom("web1", web2, 0, 7000, 64, fmt.Sprintf("after-delete-%d", i))
	}
	stopWatches(t, mon2)
	for _, f := range mon2.frames {
		if strings.HasPrefix(f.payload, "after-delete-") {
			t.Errorf("mon2 received a copy after the policy was deleted: %s", f)
		}
	}
}

func TestPrivilegedTapMonitorOutsideTheFarmsIsRefusedWithoutConsent(t *testing.T) {
	l := upLab(t, tapLab)
	out, err := l.cli("tap", "create", "spy", "--sender", "blue/web/web1", "--receiver", "blue/web/web2", "--monitor", "red/ops/ops1")
	if err == nil || !strings.Contains(out, "red") {
		t.Fatalf("a monitor in farm red on blue's traffic: err %v, output %q; want a refusal naming the farm", err, out)
	}
	out, err = l.cli("tap", "create", "spy", "--sender", "blue/web/web1", "--receiver", "blue/web/web2", "--monitor", "red/ops/ops1", "--cross-farm")
	if err == nil {
		t.Fatalf("--cross-farm without the farms peering was accepted: %q", out)
	}
}
