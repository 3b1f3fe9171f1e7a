package e2e

import (
	byteorder "encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/csum"
	"github.com/onehop/onehop/internal/testenv"
)

// What an attack run found, tried again with real traffic: a hostile tenant
// and a node on the fabric that is no host. Each test sends what must not
// get through, proves its captures were live throughout, and checks the
// drop counter that must say why.

const attackLab = `name: %s
hosts: [{name: h1}, {name: h2}, {name: h3}]
farms:
  - name: blue
    subnets: [{name: web}, {name: db}]
    rules:
      - {from: web, to: db, proto: icmp}
      - {from: web, to: db, proto: udp, port: 5353}
vms:
  - {name: web1, host: h1, subnet: blue/web}
  - {name: web2, host: h2, subnet: blue/web}
  - {name: web3, host: h1, subnet: blue/web}
  - {name: web4, host: h2, subnet: blue/web}
  - {name: db1, host: h3, subnet: blue/db}
`

// ipv4UDP builds an Ethernet frame with an IPv4/UDP datagram, as hex. vlan
// > 0 puts an 802.1Q tag (priority 5) in it; extraLen makes the IPv4 total
// length claim that many bytes more than the frame holds.
func ipv4UDP(ethSrc, ethDst string, vlan int, src, dst string, sport, dport int, id uint16, extraLen int, payload string) string {
	mac := func(s string) []byte {
		m, err := net.ParseMAC(s)
		if err != nil {
			panic(err)
		}
		return m
	}
	var b []byte
	b = append(b, mac(ethDst)...)
	b = append(b, mac(ethSrc)...)
	if vlan > 0 {
		b = byteorder.BigEndian.AppendUint16(b, 0x8100)
		b = byteorder.BigEndian.AppendUint16(b, uint16(5<<13|vlan))
	}
	b = byteorder.BigEndian.AppendUint16(b, 0x0800)
	ip := make([]byte, 20)
	ip[0], ip[8], ip[9] = 0x45, 64, 17
	byteorder.BigEndian.PutUint16(ip[2:], uint16(20+8+len(payload)+extraLen))
	byteorder.BigEndian.PutUint16(ip[4:], id)
	copy(ip[12:16], net.ParseIP(src).To4())
	copy(ip[16:20], net.ParseIP(dst).To4())
	csum.SetIPv4(ip)
	udp := make([]byte, 8) // checksum 0: none, as IPv4 allows
	byteorder.BigEndian.PutUint16(udp[0:], uint16(sport))
	byteorder.BigEndian.PutUint16(udp[2:], uint16(dport))
	byteorder.BigEndian.PutUint16(udp[4:], uint16(8+len(payload)))
	b = append(append(append(b, ip...), udp...), payload...)
	return hex.EncodeToString(b)
}

// sendFramesOn writes raw Ethernet frames (hex) out of any node's interface:
// a node on the fabric that is no host, talking on the switch itself.
func (l *testLab) sendFramesOn(node, ifname string, frames ...string) {
	l.t.Helper()
	script := `import socket,sys
s=socket.socket(socket.AF_PACKET,socket.SOCK_RAW)
s.bind((sys.argv[1],0))
for f in sys.argv[2:]:
    s.send(bytes.fromhex(f))`
	l.mustIn(node, append([]string{"python3", "-c", script, ifname}, frames...)...)
}

// dropsRose runs f and returns how much each reason's drop counter rose on
// host. A counter the agent does not export fails the test (absent is not
// zero) and is left out of the result; the test goes on, so it also says
// what got through.
func (l *testLab) dropsRose(host string, f func(), reasons ...string) map[string]float64 {
	l.t.Helper()
	before := l.metrics(host)
	f()
	after := l.metrics(host)
	d := map[string]float64{}
	for _, r := range reasons {
		a, okA := after.lookup(drops(r))
		b, okB := before.lookup(drops(r))
		if !okA || !okB {
			l.t.Errorf("%s exports no drop counter %q", host, r)
			continue
		}
		d[r] = a - b
	}
	return d
}

// marked returns the frames a stopped watch holds whose UDP payload starts
// with prefix.
func marked(w *watch, prefix string) []frame {
	var out []frame
	for _, f := range w.frames {
		if strings.HasPrefix(f.payload, prefix) {
			out = append(out, f)
		}
	}
	return out
}

// A VM must not choose VLANs or priorities on the underlay. veths take a
// tag out of the frame into the packet's metadata before tcx sees it, so a
// datapath that only reads the frame forwards it, and the uplink puts the
// tag back on the wire.
func TestAttackVLANTaggedFramesFromAVMNeverReachTheFabric(t *testing.T) {
	l := upLab(t, attackLab)
	// h1 maps web4 first, so a tagged frame would go straight out. The
	// first echo waits for the ARP engine (-W 1 each): under load it can
	// take longer, so the mapping is awaited, not one echo.
	testenv.Eventually(t, "h1 to map web4 (a ping web1 -> web4 answered)", 10*time.Second, func() error {
		return l.ping("web1", l.ip("web4"), 1)
	})
	fabric := l.watchFabric("web1", "web2")
	web4 := l.watchVM("web4", "web2")
	proveLive(t, "start", fabric, web4)
	var frames []string
	for i := 0; i < 3; i++ {
		frames = append(frames, ipv4UDP(l.mac("web1", "eth0"), l.mac("web4", "eth0"), 10, l.ip("web1"), l.ip("web4"),
			40000, 9999, 0, 0, fmt.Sprintf("tagged-%d", i)))
	}
	d := l.dropsRose("h1", func() { l.sendFrames("web1", frames...) }, "vlan_tagged")
	stopWatches(t, fabric, web4)
	for _, w := range []*watch{fabric, web4} {
		for _, f := range marked(w, "tagged-") {
			t.Errorf("a tagged frame from web1 reached %s: %s", w.node, f)
		}
	}
	if n, ok := d["vlan_tagged"]; ok && n != 3 {
		t.Errorf("vlan_tagged on h1 rose by %v, want 3", n)
	}
}

// Non-first fragments carry no ports: they pass by the admission of their
// datagram's first fragment, on the sending and the receiving host.
func TestAttackFragmentedTrafficOfAllowedFlowsArrives(t *testing.T) {
	l := upLab(t, attackLab)
	db1 := l.ip("db1")
	if out, err := l.in("web1", "ping", "-c", "3", "-i", "0.2", "-W", "2", "-s", "3000", db1); err != nil ||
		!strings.Contains(out, "3 received") {
		t.Errorf("ping -s 3000 web1 -> db1 (icmp allowed web -> db) lost packets: %v\n%s", err, out)
	}
	recv := l.start("db1", "python3", "-c", `import socket
s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)
s.bind(("",5353))
print("listening",flush=True)
d,a=s.recvfrom(65535)
print("got",len(d),flush=True)`)
	testenv.Eventually(t, "the receiver on db1", 5*time.Second, func() bool { return strings.Contains(recv.Output(), "listening") })
	payload := strings.Repeat("f", 3000)
	// The first datagram may be held while h1 learns where db1 lives; send
	// until one arrives.
	testenv.Eventually(t, "a 3000-byte datagram web1 -> db1:5353 (udp/5353 allowed web -> db)", 10*time.Second, func() bool {
		l.sendUDPFrom("web1", db1, 0, 5353, 64, payload)
		time.Sleep(200 * time.Millisecond)
		return strings.Contains(recv.Output(), "got")
	})
	if out := recv.Output(); !strings.Contains(out, "got 3000") {
		t.Errorf("db1 received %q, want the whole 3000-byte datagram", out)
	}
}

// A VM is only ever a DHCP client: what a server or relay says, from port
// 68 to port 68 inside its subnet included, reaches nobody.
func TestAttackDHCPServerMessagesFromAVMReachNoOne(t *testing.T) {
	l := upLab(t, attackLab)
	web3 := l.watchVM("web3", "web1")
	web2 := l.watchVM("web2", "web4")
	proveLive(t, "start", web3, web2)
	sends := []struct {
		dst          string
		sport, dport int
		payload      string
	}{
		{l.ip("web3"), 68, 68, "dhcp-68-68-same-host"},
		{l.ip("web2"), 68, 68, "dhcp-68-68-other-host"},
		{"10.1.1.255", 68, 68, "dhcp-68-68-subnet-broadcast"},
		{"255.255.255.255", 68, 68, "dhcp-68-68-broadcast"},
		{l.ip("web3"), 40000, 68, "dhcp-to-68"},
		{l.ip("web3"), 67, 67, "dhcp-relay-67-67"},
	}
	d := l.dropsRose("h1", func() {
		for _, s := range sends {
			l.sendUDPFrom("web1", s.dst, s.sport, s.dport, 64, s.payload)
		}
	}, "rogue_dhcp")
	stopWatches(t, web3, web2)
	for _, w := range []*watch{web3, web2} {
		for _, f := range marked(w, "dhcp-") {
			t.Errorf("a DHCP server or relay message from web1 reached %s: %s", w.node, f)
		}
	}
	if n, ok := d["rogue_dhcp"]; ok && n != float64(len(sends)) {
		t.Errorf("rogue_dhcp on h1 rose by %v, want %d", n, len(sends))
	}
}

// An IPv4 packet that claims more bytes than its frame holds is malformed,
// also on its way to a VM of the same host.
func TestAttackIPv4LongerThanItsFrameIsMalformedNotDelivered(t *testing.T) {
	l := upLab(t, attackLab)
	web3 := l.watchVM("web3", "web1")
	proveLive(t, "start", web3)
	const id = 0x4242
	f := ipv4UDP(l.mac("web1", "eth0"), l.mac("web3", "eth0"), 0, l.ip("web1"), l.ip("web3"), 40000, 9999, id, 1000, "oversized")
	d := l.dropsRose("h1", func() { l.sendFrames("web1", f, f, f) }, "malformed")
	stopWatches(t, web3)
	out, err := exec.Command("tshark", "-r", web3.pcap, "-T", "fields", "-e", "ip.id").Output()
	if err != nil {
		t.Fatalf("read %s: %v", web3.pcap, err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.TrimSpace(line) == fmt.Sprintf("0x%04x", id) {
			t.Errorf("the oversized packet (ip.id %#x) reached web3", id)
		}
	}
	if n, ok := d["malformed"]; ok && n != 3 {
		t.Errorf("malformed on h1 rose by %v, want 3", n)
	}
}

// A node on the fabric that is no host cannot speak for VMs, and a host
// cannot draw a VM's traffic to itself unless the store places the VM there.
func TestAttackTheFabricIsNotTrusted(t *testing.T) {
	l := upLab(t, attackLab)
	// h1 maps web2 (on h2) before the attack (awaited: the first echo
	// waits for the ARP engine).
	testenv.Eventually(t, "h1 to map web2 (a ping web1 -> web2 answered)", 10*time.Second, func() error {
		return l.ping("web1", l.ip("web2"), 1)
	})
	web1 := l.watchVM("web1", "web3")
	web3 := l.watchVM("web3", "web1")
	proveLive(t, "start", web1, web3)

	rogue := "02:42:de:ad:be:ef" // no node record has it
	h1, h3 := l.mac("h1", "uplink0"), l.mac("h3", "uplink0")
	web1IP, web2IP := l.ip("web1"), l.ip("web2")
	scope, bcast, zero := "03:00:0a:01:01:00", "ff:ff:ff:ff:ff:ff", "00:00:00:00:00:00"
	fromNoHost := []string{
		ipv4UDP(rogue, h1, 0, "10.1.1.70", web1IP, 40000, 9999, 0, 0, "rogue-new-vm"),
		ipv4UDP(rogue, h1, 0, web2IP, web1IP, 40000, 9999, 0, 0, "rogue-as-web2"),
		ipv4UDP(rogue, scope, 0, "10.1.1.70", "10.1.1.255", 40000, 9999, 0, 0, "rogue-broadcast"),
		// "web2 asks for web1": would point h1's entry for web2 at the rogue.
		arpFrame(1, rogue, scope, virtualMAC(web2IP), web2IP, zero, web1IP),
	}
	// A known host's MAC (h3's), announcing web2, which the store places on h2.
	lie := arpFrame(2, h3, bcast, virtualMAC(web2IP), web2IP, bcast, web2IP)
	d := l.dropsRose("h1", func() {
		l.sendFramesOn("fabric", "br0", fromNoHost...)
		l.sendFramesOn("fabric", "br0", lie)
	}, "fabric_unknown_host")
	// h1's entry for web2 still names h2: web1's traffic to web2 arrives.
	web2 := l.watchVM("web2", "web4")
	proveLive(t, "after", web2)
	l.sendUDPFrom("web1", web2IP, 0, 9999, 64, "after-the-lies")
	testenv.Eventually(t, "web1's datagram to reach web2 after the lies", 5*time.Second, func() bool { return web2.saw("after-the-lies") })
	stopWatches(t, web1, web3, web2)
	for _, w := range []*watch{web1, web3} {
		for _, f := range marked(w, "rogue-") {
			t.Errorf("a frame from a node that is no host reached %s: %s", w.node, f)
		}
	}
	if n, ok := d["fabric_unknown_host"]; ok && n != float64(len(fromNoHost)) {
		t.Errorf("fabric_unknown_host on h1 rose by %v, want %d", n, len(fromNoHost))
	}
}

// fabricLab is attackLab with a node on the fabric that is no host.
const fabricLab = attackLab + `externals: [{name: rogue}]
`

// bridgeJSON runs `bridge -j ARGS` on the lab's fabric and decodes it.
func (l *testLab) bridgeJSON(args ...string) []map[string]any {
	l.t.Helper()
	out := l.mustIn("fabric", append([]string{"bridge", "-j"}, args...)...)
	var v []map[string]any
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		l.t.Fatalf("bridge -j %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return v
}

// rxPackets is how many frames the fabric switch received on port.
func (l *testLab) rxPackets(port string) float64 {
	l.t.Helper()
	out := l.mustIn("fabric", "ip", "-s", "-j", "link", "show", "dev", port)
	var v []struct {
		Stats struct {
			RX struct {
				Packets float64 `json:"packets"`
			} `json:"rx"`
		} `json:"stats64"`
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil || len(v) != 1 {
		l.t.Fatalf("ip -s -j link show %s on the fabric: %v\n%s", port, err, out)
	}
	return v[0].Stats.RX.Packets
}

// A host's MAC is its only identity on the fabric, so the switch must bind
// each host's MAC to its port, or any node on the fabric can send as a host
// (and have its frames believed, TAP copies included). The lab's fabric is
// such a switch: every port locked, learning off, one static entry for the
// station plugged into it. A live control first (h2's own frame reaches
// h1), then the rogue's frames with h2's MAC, then proof the rogue's port
// and h1's capture still work (the rogue's own frame arrives).
func TestAttackAHostsMACFromAnotherFabricPortIsDroppedByTheFabric(t *testing.T) {
	testenv.RequireTool(t, "bridge")
	l := upLab(t, fabricLab)
	h1, h2, rogue := l.mac("h1", "uplink0"), l.mac("h2", "uplink0"), l.mac("rogue", "eth0")

	// What the switch is: every port locked and learning nothing, each
	// bound to its node's MAC by a static entry.
	ports := l.bridgeJSON("-d", "link", "show")
	if len(ports) == 0 {
		t.Fatal("the fabric bridge has no ports")
	}
	for _, p := range ports {
		if p["locked"] != true || p["learning"] != false {
			t.Errorf("fabric port %v: locked %v learning %v, want locked and not learning", p["ifname"], p["locked"], p["learning"])
		}
	}
	bound := map[string]string{}
	for _, e := range l.bridgeJSON("fdb", "show", "br", "br0") {
		if e["state"] == "static" {
			bound[fmt.Sprint(e["mac"])] = fmt.Sprint(e["ifname"])
		}
	}
	for mac, port := range map[string]string{h1: "p-h1", h2: "p-h2", rogue: "p-rogue"} {
		if bound[mac] != port {
			t.Errorf("the fabric binds %s to %q, want %s (static entries: %v)", mac, bound[mac], port, bound)
		}
	}

	web1IP, web2IP := l.ip("web1"), l.ip("web2")
	asH2 := func(payload string) string { return ipv4UDP(h2, h1, 0, web2IP, web1IP, 40000, 9999, 0, 0, payload) }
	w := l.startWatch(&watch{l: l, node: "h1"}, "uplink0", "-Q", "in")
	// Sent until h1's uplink records it: the capture may not be listening yet.
	arrives := func(what, node, ifname, frame, payload string) {
		t.Helper()
		testenv.Eventually(t, what, 10*time.Second, func() bool {
			l.sendFramesOn(node, ifname, frame)
			for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
				if w.saw(payload) {
					return true
				}
			}
			return false
		})
	}
	arrives("control: h2's own frame to reach h1's uplink", "h2", "uplink0", asH2("h2-before"), "h2-before")

	rx := l.rxPackets("p-rogue")
	var spoofed []string
	for i := 0; i < 3; i++ {
		spoofed = append(spoofed, asH2(fmt.Sprintf("spoof-%d", i)))
	}
	l.sendFramesOn("rogue", "eth0", spoofed...)
	// After them on the same port: the rogue's own MAC passes the switch
	// (h1's datapath refuses it: no host's), and so does h2's frame.
	arrives("the rogue's own frame to reach h1's uplink", "rogue", "eth0",
		ipv4UDP(rogue, h1, 0, web2IP, web1IP, 40000, 9999, 0, 0, "rogue-own"), "rogue-own")
	arrives("h2's frame after the attack", "h2", "uplink0", asH2("h2-after"), "h2-after")
	w.dump.Stop()
	frames, err := w.read(false)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range frames {
		if strings.HasPrefix(f.payload, "spoof-") {
			t.Errorf("a frame with h2's MAC from the rogue's port reached h1: %s", f)
		}
	}
	// The switch took them in on the rogue's port and forwarded none.
	if got := l.rxPackets("p-rogue") - rx; got < float64(len(spoofed)+1) {
		t.Errorf("the fabric's port p-rogue received %v frames, want at least %d (the spoofed ones and the rogue's own)", got, len(spoofed)+1)
	}
}
