package e2e

import (
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/testenv"
)

// A leak test sends what must be blocked and then proves nothing arrived.
// "Nothing arrived" only means something if the capture was recording the
// whole time, so every watch below is proven live twice: a packet that must
// arrive (from a peer the datapath lets through) is seen before the test
// sends anything forbidden, and another one after.

// frame is one captured frame, the fields a leak test looks at.
type frame struct {
	ethSrc, ethDst      string
	ipSrc, ipDst, proto string
	icmpType            string
	payload             string // UDP payload, decoded
	arpOp               string // "1" request, "2" reply
	arpSHA, arpSPA      string
	arpTHA, arpTPA      string
	ethType             string // "0x0800", "0x0806", ...
	ttl                 string
	sport, dport        string // UDP ports
	protocols           string // tshark's frame.protocols: "eth:ethertype:ip:udp:data"
	line                string
}

var frameFields = []string{"eth.src", "eth.dst", "ip.src", "ip.dst", "ip.proto", "icmp.type", "udp.payload",
	"arp.opcode", "arp.src.hw_mac", "arp.src.proto_ipv4", "arp.dst.hw_mac", "arp.dst.proto_ipv4",
	"eth.type", "ip.ttl", "udp.srcport", "udp.dstport", "frame.protocols"}

func (f frame) String() string { return strings.ReplaceAll(f.line, "\t", " ") }

// watch records the frames a node receives on one interface.
type watch struct {
	l    *testLab
	node string // a VM (its eth0, inbound only) or "fabric" (br0, everything)
	peer string // a VM whose UDP to node must arrive: the liveness proof
	// fabricTo: for the fabric, the VM the peer's proof packets go to.
	fabricTo string
	pcap     string
	dump     *background
	frames   []frame
}

// watchVM captures what vm receives; peer must be able to reach it.
func (l *testLab) watchVM(vm, peer string) *watch {
	return l.startWatch(&watch{l: l, node: vm, peer: peer}, "eth0", "-Q", "in")
}

// watchFabric captures the fabric switch; from and to must be VMs on two
// different hosts that may talk, so their UDP crosses it.
func (l *testLab) watchFabric(from, to string) *watch {
	w := l.startWatch(&watch{l: l, node: "fabric", peer: from}, "br0")
	w.fabricTo = to
	return w
}

func (l *testLab) startWatch(w *watch, ifname string, extra ...string) *watch {
	l.t.Helper()
	// A VM whose name another farm's VM has too is node FARM/VM.
	w.pcap = filepath.Join(l.t.TempDir(), strings.ReplaceAll(w.node, "/", ".")+".pcap")
	args := append([]string{"tcpdump", "-i", ifname, "-n", "-U", "--immediate-mode", "-w", w.pcap}, extra...)
	// Not waited for here: proveLive, which must come before anything
	// forbidden is sent, waits until the capture records.
	w.dump = l.start(w.node, args...)
	return w
}

// target is the VM whose address the liveness packets go to.
func (w *watch) target() string {
	if w.node == "fabric" {
		return w.fabricTo
	}
	return w.node
}

// read parses what the capture holds. While tcpdump runs (partial), a file
// not there yet or cut short in a record it is writing is what there is so
// far; once it stopped, the file must read whole.
func (w *watch) read(partial bool) ([]frame, error) {
	args := []string{"-r", w.pcap, "-T", "fields", "-E", "occurrence=f"}
	for _, f := range frameFields {
		args = append(args, "-e", f)
	}
	cmd := exec.Command("tshark", args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		cutShort := strings.Contains(stderr.String(), "cut short")
		missing := errors.Is(statErr(w.pcap), os.ErrNotExist)
		if !partial || !(cutShort || missing) {
			return nil, fmt.Errorf("tshark -r %s (capture on %s): %v: %s", w.pcap, w.node, err, stderr.String())
		}
	}
	var frames []frame
	for _, line := range strings.Split(string(out), "\n") {
		if line == "" {
			continue
		}
		c := strings.Split(line, "\t")
		for len(c) < len(frameFields) {
			c = append(c, "")
		}
		payload, err := hex.DecodeString(strings.ReplaceAll(c[6], ":", ""))
		if err != nil {
			return nil, fmt.Errorf("capture on %s: udp.payload %q: %v", w.node, c[6], err)
		}
		frames = append(frames, frame{ethSrc: c[0], ethDst: c[1], ipSrc: c[2], ipDst: c[3], proto: c[4], icmpType: c[5],
			payload: string(payload), arpOp: c[7], arpSHA: c[8], arpSPA: c[9], arpTHA: c[10], arpTPA: c[11],
			ethType: c[12], ttl: c[13], sport: c[14], dport: c[15], protocols: c[16], line: line})
	}
	return frames, nil
}

func statErr(path string) error {
	_, err := os.Stat(path)
	return err
}

// saw tells whether the running capture holds a datagram with payload. A
// capture that cannot be read fails the test (and sees nothing).
func (w *watch) saw(payload string) bool {
	frames, err := w.read(true)
	if err != nil {
		w.l.t.Error(err)
		return false
	}
	for _, f := range frames {
		if f.payload == payload {
			return true
		}
	}
	return false
}

// proveLive has each watch's peer send it a datagram tagged with phase until
// the watch records it. The first packet to a destination may be held while
// the datapath learns where it is, so the capture is polled for a while
// after each send, and peers send again until theirs lands.
func proveLive(t *testing.T, phase string, ws ...*watch) {
	t.Helper()
	msg := func(w *watch) string { return fmt.Sprintf("alive-%s-%s", phase, w.node) }
	pending := ws
	lastErr := map[*watch]error{}
	for try := 0; len(pending) > 0; try++ {
		if try == 20 {
			for _, w := range pending {
				t.Errorf("the capture on %s never saw %s's %q: it proves nothing (last send error: %v)",
					w.node, w.peer, msg(w), lastErr[w])
			}
			t.FailNow()
		}
		seen := make([]bool, len(pending))
		errs := make([]error, len(pending))
		var wg sync.WaitGroup
		for i, w := range pending {
			wg.Add(1)
			go func(i int, w *watch, dst string) {
				defer wg.Done()
				if out, err := w.l.in(w.peer, "python3", "-c", udpScript, dst, "0", "9999", "64", msg(w)); err != nil {
					errs[i] = fmt.Errorf("%v: %s", err, out)
					return
				}
				for deadline := time.Now().Add(time.Second); !seen[i] && time.Now().Before(deadline); {
					if seen[i] = w.saw(msg(w)); !seen[i] {
						time.Sleep(100 * time.Millisecond) // the poll interval
					}
				}
			}(i, w, w.l.ip(w.target()))
		}
		wg.Wait()
		var still []*watch
		for i, w := range pending {
			if errs[i] != nil {
				lastErr[w] = errs[i]
			}
			if !seen[i] {
				still = append(still, w)
			}
		}
		pending = still
	}
}

// stopWatches proves every watch still live, stops it and keeps its frames.
func stopWatches(t *testing.T, ws ...*watch) {
	t.Helper()
	proveLive(t, "end", ws...)
	// A quiet window, not a wait for a condition: something sent before the
	// end proof may travel slower than it (a packet a host's ARP engine
	// held), and must still be seen if it arrives. Its length is part of
	// what the leak tests measure.
	time.Sleep(300 * time.Millisecond)
	var wg sync.WaitGroup
	errs := make([]error, len(ws))
	for i, w := range ws {
		wg.Add(1)
		go func(i int, w *watch) {
			defer wg.Done()
			w.dump.Stop()
			w.frames, errs[i] = w.read(false)
		}(i, w)
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

// captureFile records packets on ifname inside node, and returns the pcap
// file being written and a function that stops the capture and returns one
// line per packet with the requested tshark fields, tab-separated. It is
// for what must be seen (the caller checks it was): a check that nothing
// arrived needs a watch, proven live before and after.
func (l *testLab) captureFile(node, ifname string, fields ...string) (func() []string, string) {
	l.t.Helper()
	pcap := filepath.Join(l.t.TempDir(), node+".pcap")
	dump := l.start(node, "tcpdump", "-i", ifname, "-n", "-U", "--immediate-mode", "-w", pcap)
	testenv.Eventually(l.t, "tcpdump on "+node, 5*time.Second, func() bool {
		return strings.Contains(dump.Output(), "listening on")
	})
	return func() []string {
		l.t.Helper()
		dump.Stop() // SIGINT: tcpdump writes out what it holds
		args := []string{"-r", pcap, "-T", "fields"}
		for _, f := range fields {
			args = append(args, "-e", f)
		}
		out, err := exec.Command("tshark", args...).Output()
		if err != nil {
			l.t.Fatalf("tshark -r %s: %v", pcap, err)
		}
		var lines []string
		for _, line := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
			if line != "" {
				lines = append(lines, line)
			}
		}
		return lines
	}, pcap
}

// liveness tells whether f is one of the watches' own proof packets.
func (f frame) liveness() bool { return strings.HasPrefix(f.payload, "alive-") }

// dropDelta runs f and returns how much each of reasons rose on host. A
// reason the agent does not export is an error (absent is not zero) and is
// left out of the result, so the caller's check fails too.
func (l *testLab) dropDelta(host string, f func(), reasons ...string) map[string]float64 {
	l.t.Helper()
	before := l.metrics(host)
	f()
	after := l.metrics(host)
	d := map[string]float64{}
	for _, r := range reasons {
		a, okA := after.lookup(drops(r))
		b, okB := before.lookup(drops(r))
		if !okA || !okB {
			l.t.Errorf("%s exports no drop counter %q (absent is not zero); it has %v", host, r, after.family(drops(r)))
			continue
		}
		d[r] = a - b
	}
	return d
}

// arpFrame builds an Ethernet frame carrying ARP for IPv4, as hex.
func arpFrame(op int, ethSrc, ethDst, sha, spa, tha, tpa string) string {
	mac := func(s string) []byte {
		m, err := net.ParseMAC(s)
		if err != nil {
			panic(err)
		}
		return m
	}
	ip := func(s string) []byte { return net.ParseIP(s).To4() }
	var b []byte
	b = append(b, mac(ethDst)...)
	b = append(b, mac(ethSrc)...)
	b = append(b, 0x08, 0x06)             // ARP
	b = append(b, 0, 1, 0x08, 0, 6, 4, 0) // Ethernet, IPv4, hlen, plen, op high byte
	b = append(b, byte(op))
	b = append(b, mac(sha)...)
	b = append(b, ip(spa)...)
	b = append(b, mac(tha)...)
	b = append(b, ip(tpa)...)
	return hex.EncodeToString(b)
}

// sendFrames writes raw Ethernet frames (hex) out of a VM's eth0, the way a
// VM's own tooling could, bypassing its kernel's ARP and IP.
func (l *testLab) sendFrames(vm string, frames ...string) {
	l.t.Helper()
	script := `import socket,sys
s=socket.socket(socket.AF_PACKET,socket.SOCK_RAW)
s.bind(("eth0",0))
for f in sys.argv[1:]:
    s.send(bytes.fromhex(f))`
	l.mustIn(vm, append([]string{"python3", "-c", script}, frames...)...)
}

// sendEchoReply sends an ICMP echo reply that answers nothing (a forged
// "reply" trying to pass as part of a flow).
func (l *testLab) sendEchoReply(vm, dst string, id int) {
	l.t.Helper()
	script := `import socket,struct,sys
def csum(b):
    s=sum(struct.unpack("!%dH"%(len(b)//2),b))
    s=(s>>16)+(s&0xffff); s+=s>>16
    return ~s&0xffff
body=b"forged-reply"
h=struct.pack("!BBHHH",0,0,0,int(sys.argv[2]),1)
p=struct.pack("!BBHHH",0,0,csum(h+body),int(sys.argv[2]),1)+body
s=socket.socket(socket.AF_INET,socket.SOCK_RAW,socket.IPPROTO_ICMP)
s.sendto(p,(sys.argv[1],0))`
	l.mustIn(vm, "python3", "-c", script, dst, fmt.Sprint(id))
}

// tcpBlocked tries a TCP connection that must neither open nor be refused
// (a refusal is an RST: the SYN got there).
func (l *testLab) tcpBlocked(from, ip string, port int) error {
	out, err := l.in(from, "timeout", "1", "bash", "-c", fmt.Sprintf("exec 3<>/dev/tcp/%s/%d", ip, port))
	if err == nil {
		return fmt.Errorf("TCP %s -> %s:%d connected", from, ip, port)
	}
	if ee, ok := err.(*exec.ExitError); ok && ee.ExitCode() != 124 {
		return fmt.Errorf("TCP %s -> %s:%d was refused, so the SYN arrived: %s", from, ip, port, out)
	}
	return nil
}

// neighbours returns vm's IPv4 neighbour table on eth0: address -> MAC.
func (l *testLab) neighbours(vm string) map[string]string {
	l.t.Helper()
	m := map[string]string{}
	for _, line := range strings.Split(l.mustIn(vm, "ip", "-4", "neigh", "show", "dev", "eth0"), "\n") {
		f := strings.Fields(line)
		for i := 0; i+1 < len(f); i++ {
			if f[i] == "lladdr" {
				m[f[0]] = f[i+1]
			}
		}
	}
	return m
}

// virtualMAC is the MAC onehop gives the VM (or gateway) with address ip.
func virtualMAC(ip string) string {
	a := net.ParseIP(ip).To4()
	return fmt.Sprintf("02:00:%02x:%02x:%02x:%02x", a[0], a[1], a[2], a[3])
}

func subnetOf(ip string) string { return ip[:strings.LastIndexByte(ip, '.')] }

// sendUDPFrom sends one datagram from a VM, from sport (0: any) to dst:dport.
func (l *testLab) sendUDPFrom(vm, dst string, sport, dport, ttl int, payload string) {
	l.t.Helper()
	l.mustIn(vm, "python3", "-c", udpScript, dst, fmt.Sprint(sport), fmt.Sprint(dport), fmt.Sprint(ttl), payload)
}

// udpScript sends one datagram: DST SPORT DPORT TTL PAYLOAD.
const udpScript = `import socket,sys
s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET,socket.SO_BROADCAST,1)
s.setsockopt(socket.IPPROTO_IP,socket.IP_MULTICAST_TTL,int(sys.argv[4]))
s.setsockopt(socket.IPPROTO_IP,socket.IP_TTL,int(sys.argv[4]))
s.bind(("",int(sys.argv[2])))
s.sendto(sys.argv[5].encode(),(sys.argv[1],int(sys.argv[3])))`
