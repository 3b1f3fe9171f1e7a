package e2e

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/lab"
	"github.com/onehop/onehop/internal/testenv"
)

// TAP copies to a file and to a collector (issue 23 item 3): onehop tap
// capture writes a policy's copies to a pcap file; a policy with a
// collector sends them to a machine on the fabric as ERSPAN or GRE. tshark
// reads both and finds exactly the matching packets.

// tapCollectorLab is tapLab with a machine on the fabric to collect copies.
const tapCollectorLab = tapLab + `externals:
  - {name: col}
`

// capturedUDP is one UDP datagram tshark read from a capture: outer and
// inner addresses (all occurrences, outer first), the GRE and ERSPAN
// fields of an encapsulated copy, and the innermost UDP.
type capturedUDP struct {
	ipSrc, ipDst            []string
	greProto                string
	erspanVersion, erspanID string
	dport, payload          string
}

// readUDP decodes path with tshark: every frame that holds UDP, but ICMP
// errors that quote one (a collector with no GRE endpoint answers copies
// with protocol unreachable).
func readUDP(t *testing.T, path string, partial bool) []capturedUDP {
	t.Helper()
	out, err := exec.Command("tshark", "-r", path, "-Y", "udp && !icmp", "-T", "fields", "-E", "occurrence=a", "-E", "aggregator=,",
		"-e", "ip.src", "-e", "ip.dst", "-e", "gre.proto", "-e", "erspan.version", "-e", "erspan.spanid", "-e", "udp.dstport", "-e", "udp.payload").Output()
	if err != nil {
		if partial {
			return nil // not there yet, or cut short in a record being written
		}
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("tshark -r %s: %v: %s", path, err, stderr)
	}
	var got []capturedUDP
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		c := strings.Split(line, "\t")
		if len(c) < 7 {
			continue
		}
		ports, payloads := strings.Split(c[5], ","), strings.Split(c[6], ",")
		p, err := hex.DecodeString(strings.ReplaceAll(payloads[len(payloads)-1], ":", ""))
		if err != nil {
			t.Fatalf("%s: udp.payload %q: %v", path, c[6], err)
		}
		got = append(got, capturedUDP{ipSrc: strings.Split(c[0], ","), ipDst: strings.Split(c[1], ","), greProto: c[2],
			erspanVersion: c[3], erspanID: c[4], dport: ports[len(ports)-1], payload: string(p)})
	}
	return got
}

// byPayload counts the datagrams whose payload starts with prefix.
func byPayload(got []capturedUDP, prefix string) map[string][]capturedUDP {
	out := map[string][]capturedUDP{}
	for _, g := range got {
		if strings.HasPrefix(g.payload, prefix) {
			out[g.payload] = append(out[g.payload], g)
		}
	}
	return out
}

// tapID is a policy's id, as the API answers it.
func (l *testLab) tapID(name string) int {
	l.t.Helper()
	out, err := l.cli("tap", "get", name, "-o", "json")
	if err != nil {
		l.t.Fatalf("tap get %s: %v\n%s", name, err, out)
	}
	var v struct {
		ID int `json:"id"`
	}
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		l.t.Fatalf("tap get %s -o json: %v\n%s", name, err, out)
	}
	return v.ID
}

// startCLI runs onehop ARGS against the lab's API in the background; it is
// stopped when the test ends if not before.
func (l *testLab) startCLI(args ...string) *background {
	l.t.Helper()
	st, err := lab.Load(testRoot, l.name)
	if err != nil {
		l.t.Fatal(err)
	}
	return l.background(exec.Command(binary, append(args, "--api", st.APISocket)...))
}

// awaitInCapture sends probes from -> to:port until one shows in the
// capture at path: the capture is live and the policy has reached the
// sender's host.
func (l *testLab) awaitInCapture(path, from, to string, port int, what string) {
	l.t.Helper()
	n := 0
	testenv.Eventually(l.t, what, 10*time.Second, func() error {
		n++
		probe := fmt.Sprintf("probe-%s-%d", from, n)
		l.sendUDPFrom(from, l.ip(to), 0, port, 64, probe)
		time.Sleep(200 * time.Millisecond) // let the copy land before looking
		if len(byPayload(readUDP(l.t, path, true), probe)) == 0 {
			return fmt.Errorf("%s has no %s yet", path, probe)
		}
		return nil
	})
}

func TestPrivilegedTapCaptureWritesExactlyTheMatchingPacketsToAPcapFile(t *testing.T) {
	testenv.RequireTool(t, "tshark")
	l := upLab(t, tapLab)
	web1, web2 := l.ip("web1"), l.ip("web2")
	l.tap("create", "cap", "--sender", "blue/web/web1", "--receiver", "blue/web/web2", "--monitor", "blue/web/mon1", "--proto", "udp", "--dport", "7000")

	// Bad input, each a clear error naming what is wrong.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"tap", "capture", "nope", "-w", filepath.Join(t.TempDir(), "x.pcap")}, "tap nope"},
		{[]string{"tap", "capture", "cap", "-w", "/nonexistent-dir/x.pcap"}, "-w /nonexistent-dir/x.pcap"},
		{[]string{"tap", "capture", "cap"}, "-w FILE is required"},
		{[]string{"tap", "create", "bad", "--sender", "blue/web/web1", "--receiver", "any", "--collector", "203.0.113.9"}, "not on the fabric"},
		{[]string{"tap", "create", "bad", "--sender", "blue/web/web1", "--receiver", "any", "--collector", l.addr("h2", "uplink0")}, "host h2's own address"},
		{[]string{"tap", "create", "bad", "--sender", "blue/web/web1", "--receiver", "any", "--collector", "10.99.0.9", "--encap", "vxlan"}, `unknown encapsulation "vxlan"`},
	} {
		out, err := l.cli(c.args...)
		if err == nil || !strings.Contains(out, c.want) {
			t.Errorf("onehop %s: %v, %q; want an error with %q", strings.Join(c.args, " "), err, out, c.want)
		}
	}

	path := filepath.Join(t.TempDir(), "cap.pcap")
	capture := l.startCLI("tap", "capture", "cap", "-w", path, "--duration", "2m")
	l.awaitInCapture(path, "web1", "web2", 7000, "onehop tap capture to record web1's probes")

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
	// The last matching datagram, once in the file, is behind every
	// other (one path, in order).
	l.awaitInCapture(path, "web1", "web2", 7000, "the closing probe")
	out := capture.Stop()
	if !strings.Contains(out, "packets captured to "+path) {
		t.Fatalf("onehop tap capture ended without its summary:\n%s", out)
	}

	got := readUDP(t, path, false)
	matches := byPayload(got, "match-")
	for i := 0; i < 5; i++ {
		g := matches[fmt.Sprintf("match-%d", i)]
		if len(g) != 1 {
			t.Errorf("the file holds match-%d %d times, want once", i, len(g))
			continue
		}
		if g[0].ipSrc[0] != web1 || g[0].ipDst[0] != web2 || g[0].dport != "7000" || g[0].greProto != "" {
			t.Errorf("match-%d reads as %+v, want the original %s -> %s:7000, unwrapped", i, g[0], web1, web2)
		}
	}
	for _, g := range got {
		if !strings.HasPrefix(g.payload, "match-") && !strings.HasPrefix(g.payload, "probe-web1-") {
			t.Errorf("the file holds a packet the policy does not match: %+v", g)
		}
	}
	if icmp, err := exec.Command("tshark", "-r", path, "-Y", "icmp").Output(); err != nil || len(strings.TrimSpace(string(icmp))) != 0 {
		t.Errorf("the file holds ICMP (%v): %s", err, icmp)
	}

	// The capture is over everywhere: another may start at once, and it
	// ends by itself after its count.
	again := filepath.Join(t.TempDir(), "again.pcap")
	second := l.startCLI("tap", "capture", "cap", "-w", again, "--count", "1", "--duration", "30s")
	l.awaitInCapture(again, "web1", "web2", 7000, "a second capture of the same policy")
	select {
	case <-second.done:
	case <-time.After(10 * time.Second):
		t.Fatalf("a capture with --count 1 did not end after its packet:\n%s", second.Output())
	}
	if out := second.Output(); !strings.Contains(out, "1 packets captured") {
		t.Fatalf("second capture: %s", out)
	}
}

func TestPrivilegedTapCollectorReceivesERSPANAndGREThatTsharkDecodes(t *testing.T) {
	testenv.RequireTool(t, "tshark", "tcpdump")
	l := upLab(t, tapCollectorLab)
	web1, web2, db1 := l.ip("web1"), l.ip("web2"), l.ip("db1")
	col := l.addr("col", "eth0")
	h1, h2 := l.addr("h1", "uplink0"), l.addr("h2", "uplink0")

	// A live capture on the collector, from before any policy.
	path := filepath.Join(t.TempDir(), "col.pcap")
	l.start("col", "tcpdump", "-i", "eth0", "-n", "-U", "--immediate-mode", "-w", path)
	l.tap("create", "e2", "--sender", "blue/web/web1", "--receiver", "blue/web/web2", "--collector", col, "--proto", "udp", "--dport", "7000")
	l.tap("create", "e3", "--sender", "blue/web/web1", "--receiver", "blue/db/db1", "--collector", col, "--encap", "erspan3", "--proto", "udp", "--dport", "7100")
	l.tap("create", "g", "--sender", "blue/web/web2", "--receiver", "blue/web/web1", "--collector", col, "--encap", "gre", "--proto", "udp", "--dport", "7200")
	ids := map[string]string{"e2": fmt.Sprint(l.tapID("e2")), "e3": fmt.Sprint(l.tapID("e3"))}
	l.awaitInCapture(path, "web1", "web2", 7000, "the collector to see e2's copies")
	l.awaitInCapture(path, "web1", "db1", 7100, "the collector to see e3's copies")
	l.awaitInCapture(path, "web2", "web1", 7200, "the collector to see g's copies")

	type flow struct {
		policy, from, to, src, dst, host string
		port                             int
		proto, version, id               string
	}
	flows := []flow{
		{"e2", "web1", "web2", web1, web2, h1, 7000, "0x88be", "1", ids["e2"]},
		{"e3", "web1", "db1", web1, db1, h1, 7100, "0x22eb", "2", ids["e3"]},
		{"g", "web2", "web1", web2, web1, h2, 7200, "0x6558", "", ""},
	}
	for _, f := range flows {
		for i := 0; i < 3; i++ {
			l.sendUDPFrom(f.from, l.ip(f.to), 0, f.port, 64, fmt.Sprintf("%s-match-%d", f.policy, i))
			l.sendUDPFrom(f.from, l.ip(f.to), 0, f.port+1, 64, fmt.Sprintf("%s-nomatch-%d", f.policy, i))
		}
	}
	for _, f := range flows { // closing probes: everything before them has landed
		l.awaitInCapture(path, f.from, f.to, f.port, "the closing probe of "+f.policy)
	}

	got := readUDP(t, path, true)
	for _, f := range flows {
		m := byPayload(got, f.policy+"-match-")
		for i := 0; i < 3; i++ {
			g := m[fmt.Sprintf("%s-match-%d", f.policy, i)]
			if len(g) != 1 {
				t.Errorf("%s: the collector has %s-match-%d %d times, want once", f.policy, f.policy, i, len(g))
				continue
			}
			c := g[0]
			if len(c.ipSrc) != 2 || c.ipSrc[0] != f.host || c.ipDst[0] != col || c.ipSrc[1] != f.src || c.ipDst[1] != f.dst ||
				c.greProto != f.proto || c.erspanVersion != f.version || c.erspanID != f.id || c.dport != fmt.Sprint(f.port) {
				t.Errorf("%s: tshark reads %+v; want outer %s -> %s, GRE %s, ERSPAN version %q session %q, inner %s -> %s:%d",
					f.policy, c, f.host, col, f.proto, f.version, f.id, f.src, f.dst, f.port)
			}
		}
		if n := len(byPayload(got, f.policy+"-nomatch-")); n != 0 {
			t.Errorf("%s: the collector received %d datagrams the policy does not match", f.policy, n)
		}
	}
}
