package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/lab"
	"github.com/onehop/onehop/internal/lisp"
	"github.com/onehop/onehop/internal/netns"
	"github.com/onehop/onehop/internal/testenv"
)

// cloudTopo is examples/cloud-access.yaml under a test's lab name.
const cloudTopo = `name: %s
wans:
  - {name: wan1, rate: 100mbit}
  - {name: wan2, rate: 100mbit}
gateways:
  - name: gw
    eid-prefix: 10.77.0.0/24
    users: [{name: user}]
xtrs:
  - name: xtr
    eid-prefix: 10.88.0.0/24
    servers: [{name: srv}]
`

// cloudServer serves SIZE random bytes to every connection over MPTCP
// (IPPROTO_MPTCP, 262) and prints their SHA-256 first.
const cloudServer = `import socket, sys, os, hashlib
data = os.urandom(int(sys.argv[2]))
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 262)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1])))
s.listen(16)
print("sha256", hashlib.sha256(data).hexdigest(), flush=True)
while True:
    c, _ = s.accept()
    c.sendall(data)
    c.close()
`

// cloudClient downloads from ADDR PORT over plain TCP and prints the size
// and SHA-256 of what it got.
const cloudClient = `import socket, sys, hashlib
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)
h, n = hashlib.sha256(), 0
while True:
    b = s.recv(1 << 20)
    if not b:
        break
    h.update(b)
    n += len(b)
print("got", n, h.hexdigest(), flush=True)
`

const srvEID = "10.88.0.10"

// wanBytes is what the router of each WAN has sent towards the gateway
// (its gw0 link's tx bytes, read with netlink in its namespace: the
// download's direction).
func (l *testLab) wanBytes() map[string]uint64 {
	l.t.Helper()
	out := map[string]uint64{}
	for _, w := range []string{"wan1", "wan2"} {
		var links []struct {
			Stats struct {
				TX struct {
					Bytes uint64 `json:"bytes"`
				} `json:"tx"`
			} `json:"stats64"`
		}
		js := l.mustIn(w, "ip", "-s", "-j", "link", "show", "dev", "gw0")
		if err := json.Unmarshal([]byte(js), &links); err != nil || len(links) != 1 {
			l.t.Fatalf("ip -s -j link show dev gw0 on %s: %v\n%s", w, err, js)
		}
		out[w] = links[0].Stats.TX.Bytes
	}
	return out
}

// download runs the client on user and returns what it got.
func (l *testLab) download(client string, port int) (n int, sum string) {
	l.t.Helper()
	out := l.mustIn("user", "python3", client, srvEID, strconv.Itoa(port))
	m := regexp.MustCompile(`got (\d+) ([0-9a-f]{64})`).FindStringSubmatch(out)
	if m == nil {
		l.t.Fatalf("download printed %q", out)
	}
	n, _ = strconv.Atoi(m[1])
	return n, m[2]
}

// gatewayStatus is `onehop gateway status -o json` on gw.
type gatewayStatus struct {
	Paths []struct {
		Name string `json:"name"`
		Up   bool   `json:"up"`
	} `json:"paths"`
	Conns []struct {
		Dest     string `json:"dest"`
		Mode     string `json:"mode"`
		Subflows []struct {
			Path  string `json:"path"`
			State string `json:"state"`
		} `json:"subflows"`
	} `json:"conns"`
	Counters map[string]uint64 `json:"counters"`
}

func (l *testLab) gateway() gatewayStatus {
	l.t.Helper()
	var g gatewayStatus
	out := l.mustIn("gw", binary, "gateway", "status", "-o", "json")
	if err := json.Unmarshal([]byte(out), &g); err != nil {
		l.t.Fatalf("gateway status -o json: %v\n%s", err, out)
	}
	return g
}

// pathUp reports whether the gateway sees its path name up.
func (g gatewayStatus) pathUp(name string) bool {
	for _, p := range g.Paths {
		if p.Name == name {
			return p.Up
		}
	}
	return false
}

// srvSubflows counts the server's established TCP subflows on port by
// peer address (ss -tn), and its MPTCP sockets on port (ss -Mn).
func (l *testLab) srvSubflows(port int) (byPeer map[string]int, mptcp int) {
	l.t.Helper()
	byPeer = map[string]int{}
	out := l.mustIn("srv", "ss", "-Htn", "state", "established", fmt.Sprintf("( sport = :%d )", port))
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) >= 4 {
			if ap, err := netip.ParseAddrPort(f[3]); err == nil {
				byPeer[ap.Addr().String()]++
			}
		}
	}
	out = l.mustIn("srv", "ss", "-HMn", "state", "established", fmt.Sprintf("( sport = :%d )", port))
	for _, line := range strings.Split(out, "\n") {
		if strings.TrimSpace(line) != "" {
			mptcp++
		}
	}
	return byPeer, mptcp
}

// A user's plain TCP download through the gateway is carried as MPTCP over
// both WANs, LISP-encapsulated on the wire; it survives a cut of wan1 with
// its content intact, and once wan1 is back a new download uses both again.
// A Map-Register forged with the wrong key is refused and counted, and the
// mapping stays as the xTR registered it. The user cannot reach the
// controller's API through the gateway.
func TestPrivilegedCloudAccessUsesBothPathsAndSurvivesACut(t *testing.T) {
	testenv.RequireTool(t, "nstat")
	l := upLab(t, cloudTopo)
	st, err := lab.Load(testRoot, l.name)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	server, client := filepath.Join(dir, "server.py"), filepath.Join(dir, "client.py")
	for f, s := range map[string]string{server: cloudServer, client: cloudClient} {
		if err := os.WriteFile(f, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// lab status shows every node's addresses (the gateway's EIDs too).
	gw := l.node("gw")
	if gw.Cloud == nil || len(gw.Cloud.Paths) != 2 || gw.Cloud.Paths[0].EID != "10.77.0.1" || gw.Cloud.Paths[1].RLOC != "172.31.2.2" {
		t.Fatalf("lab status of gw: %+v", gw.Cloud)
	}
	if x := l.node("xtr"); x.Cloud == nil || x.Cloud.EIDPrefix != "10.88.0.0/24" || len(x.Cloud.Paths) != 2 {
		t.Fatalf("lab status of xtr: %+v", x.Cloud)
	}

	const small, big = 24 << 20, 64 << 20
	srvSmall := l.start("srv", "python3", server, "5201", strconv.Itoa(small))
	srvBig := l.start("srv", "python3", server, "5202", strconv.Itoa(big))
	sumOf := func(b *background) string {
		var sum string
		testenv.Eventually(t, "the server's hash", 20*time.Second, func() bool {
			m := regexp.MustCompile(`sha256 ([0-9a-f]{64})`).FindStringSubmatch(b.Output())
			if m != nil {
				sum = m[1]
			}
			return m != nil
		})
		return sum
	}
	wantSmall, wantBig := sumOf(srvSmall), sumOf(srvBig)

	// 1. Both paths, LISP on the wire (a live capture on wan1: it must
	// see the download's packets, encapsulated).
	stopCapture, _ := l.captureFile("wan1", "gw0", "frame.protocols", "ip.src", "ip.dst", "udp.dstport", "frame.len")
	before := l.wanBytes()
	n, sum := l.download(client, 5201)
	after := l.wanBytes()
	frames := stopCapture()
	if n != small || sum != wantSmall {
		t.Fatalf("download got %d bytes sha256 %s; want %d %s", n, sum, small, wantSmall)
	}
	d1, d2 := after["wan1"]-before["wan1"], after["wan2"]-before["wan2"]
	t.Logf("download of %d bytes: wan1 carried %d bytes, wan2 %d", small, d1, d2)
	if d1 < small/5 || d2 < small/5 {
		t.Fatalf("wan1 carried %d and wan2 %d bytes of a %d-byte download: want both used (a fifth each at least)", d1, d2, small)
	}
	// Counted in bytes, not frames: the xTR sends the gateway whole
	// superpackets (--whole-superpackets), so how many frames carry the
	// download depends on how the kernel aggregated it.
	lispFrames, lispBytes := 0, 0
	for _, f := range frames {
		c := strings.Split(f, "\t")
		if len(c) == 5 && strings.Contains(c[0], "lisp-data") && c[1] == "172.31.1.130,10.88.0.10" && c[2] == "172.31.1.2,10.77.0.1" && c[3] == "4341" {
			n, err := strconv.Atoi(c[4])
			if err != nil {
				t.Fatalf("capture on wan1: frame length %q: %v", c[4], err)
			}
			lispFrames++
			lispBytes += n
		}
	}
	if lispBytes < int(d1)/2 {
		t.Fatalf("capture on wan1 (%d frames) has %d LISP frames (%d bytes) from 172.31.1.130 (inner 10.88.0.10) to 172.31.1.2 (inner 10.77.0.1), of the %d bytes wan1 carried; first frames: %v", len(frames), lispFrames, lispBytes, d1, frames[:min(len(frames), 5)])
	}
	// The xTR learnt the gateway's EIDs from their first SYNs and handed
	// those to srv again once it could answer: no SYN had to wait for the
	// gateway's retransmission.
	if got := l.synRetrans(); got != 0 {
		t.Fatalf("the gateway retransmitted %d SYNs on the first download: the xTR's first-SYN replay did not work", got)
	}
	g := l.gateway()
	if len(g.Conns) != 1 || g.Conns[0].Mode != "mptcp" || len(g.Conns[0].Subflows) != 2 {
		t.Fatalf("gateway status after one download: %+v", g.Conns)
	}

	// 2. A long download; its subflows on the server (ss); wan1 cut
	// half-way and restored; the content intact.
	dl := l.start("user", "python3", client, srvEID, "5202")
	testenv.Eventually(t, "two subflows of the download on srv, one per gateway EID", 10*time.Second, func() error {
		peers, socks := l.srvSubflows(5202)
		if peers["10.77.0.1"] != 1 || peers["10.77.0.2"] != 1 || socks != 1 {
			return fmt.Errorf("srv's subflows by peer %v, MPTCP sockets %d", peers, socks)
		}
		return nil
	})
	start := l.wanBytes()
	testenv.Eventually(t, "a fifth of the download", 30*time.Second, func() bool {
		now := l.wanBytes()
		return now["wan1"]+now["wan2"]-start["wan1"]-start["wan2"] > big/5
	})
	l.onehop("lab", "link", "wan1", "down")
	testenv.Eventually(t, "the gateway sees wan1 down", 10*time.Second, func() error {
		if l.gateway().pathUp("wan1") {
			return errors.New("wan1 still up")
		}
		return nil
	})
	cut := l.wanBytes()
	testenv.Eventually(t, "the download to end", 60*time.Second, func() bool {
		return strings.Contains(dl.Output(), "got ")
	})
	end := l.wanBytes()
	m := regexp.MustCompile(`got (\d+) ([0-9a-f]{64})`).FindStringSubmatch(dl.Output())
	if m == nil || m[1] != strconv.Itoa(big) || m[2] != wantBig {
		t.Fatalf("download across the cut printed %q; want %d bytes sha256 %s", dl.Output(), big, wantBig)
	}
	t.Logf("after the cut: wan1 carried %d bytes, wan2 %d", end["wan1"]-cut["wan1"], end["wan2"]-cut["wan2"])
	if end["wan1"] != cut["wan1"] || end["wan2"]-cut["wan2"] < big/5 {
		t.Fatalf("after the cut wan1 carried %d bytes and wan2 %d: want nothing and the rest", end["wan1"]-cut["wan1"], end["wan2"]-cut["wan2"])
	}
	l.onehop("lab", "link", "wan1", "up")
	testenv.Eventually(t, "the gateway sees wan1 up", 10*time.Second, func() error {
		if !l.gateway().pathUp("wan1") {
			return errors.New("wan1 still down")
		}
		return nil
	})
	before = l.wanBytes()
	n, sum = l.download(client, 5201)
	after = l.wanBytes()
	if n != small || sum != wantSmall {
		t.Fatalf("download after wan1 came back got %d bytes sha256 %s", n, sum)
	}
	d1, d2 = after["wan1"]-before["wan1"], after["wan2"]-before["wan2"]
	t.Logf("after wan1 came back: wan1 carried %d bytes, wan2 %d", d1, d2)
	if d1 < small/5 || d2 < small/5 {
		t.Fatalf("after wan1 came back wan1 carried %d and wan2 %d bytes: want both used", d1, d2)
	}

	// 3. A forged Map-Register: the xTR's site and key id, the wrong key,
	// the xTR's prefix moved to another RLOC. Sent from the xTR's own
	// namespace, so only the key is wrong.
	api := []string{"--api", st.APISocket}
	refused := func() uint64 {
		var s struct {
			RegistersRefused map[string]uint64 `json:"registersRefused"`
		}
		out := l.onehopPlain(append([]string{"lisp", "server", "-o", "json"}, api...)...)
		if err := json.Unmarshal([]byte(out), &s); err != nil {
			t.Fatalf("lisp server -o json: %v\n%s", err, out)
		}
		return s.RegistersRefused["bad-auth"]
	}
	mapping := func() string {
		out := l.onehopPlain(append([]string{"lisp", "map", "list"}, api...)...)
		for _, line := range strings.Split(out, "\n") {
			if strings.HasPrefix(line, "10.88.0.0/24 ") {
				return strings.Join(strings.Fields(line)[:3], " ")
			}
		}
		t.Fatalf("lisp map list has no 10.88.0.0/24:\n%s", out)
		return ""
	}
	wasRefused, wasMapping := refused(), mapping()
	if !strings.Contains(wasMapping, "172.31.1.130/1/50 172.31.2.130/1/50") {
		t.Fatalf("the xTR's registration reads %q", wasMapping)
	}
	forged := &lisp.Registrar{Server: netip.MustParseAddrPort("192.168.100.1:4342"), KeyID: 2, Key: []byte("not-the-site-key"),
		WantMapNotify: true, Timeout: 500 * time.Millisecond, Attempts: 1,
		Records: []lisp.Record{{EID: netip.MustParsePrefix("10.88.0.0/24"), TTL: 10 * time.Minute, Authoritative: true,
			Locators: []lisp.Locator{{Addr: netip.MustParseAddr("203.0.113.66"), Priority: 1, Weight: 100, Reachable: true}}}}}
	err = netns.Do(lab.NamespaceOf(l.name, "xtr"), func() error { return forged.Register(context.Background()) })
	if !errors.Is(err, lisp.ErrNoReply) {
		t.Fatalf("a forged Map-Register got %v; want no Map-Notify", err)
	}
	if got := refused(); got != wasRefused+1 {
		t.Fatalf("map-server's bad-auth refusals went from %d to %d; want one more", wasRefused, got)
	}
	if got := mapping(); got != wasMapping {
		t.Fatalf("after a forged Map-Register the mapping is %q; was %q", got, wasMapping)
	}

	// 4. The attack run had a user reach the controller's API through the
	// gateway (401, but reached): the gateway dialled it natively from its
	// own fabric address. The API answers the gateway's own namespace
	// (the control); the user's connection is dropped and counted.
	const probe = "import socket, sys\ntry:\n    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()\n    print('reached')\nexcept OSError as e:\n    print('refused', e)\n"
	apiPort := strconv.Itoa(lab.APIPort)
	if out := l.mustIn("gw", "python3", "-c", probe, "192.168.100.1", apiPort); !strings.Contains(out, "reached") {
		t.Fatalf("control: the gateway's own namespace cannot reach the API: %s", out)
	}
	dropped := l.gateway().Counters["infrastructure_dropped"]
	if out := l.mustIn("user", "python3", "-c", probe, "192.168.100.1", apiPort); !strings.Contains(out, "refused") {
		t.Fatalf("the user reached the controller's API through the gateway: %s", out)
	}
	if got := l.gateway().Counters["infrastructure_dropped"] - dropped; got < 1 {
		t.Fatalf("the gateway's infrastructure_dropped moved by %d for the user's connection to the API", got)
	}
}

// synRetrans is how many SYNs the gateway's namespace retransmitted.
func (l *testLab) synRetrans() int {
	l.t.Helper()
	out := l.mustIn("gw", "nstat", "-az", "TcpExtTCPSynRetrans")
	m := regexp.MustCompile(`TcpExtTCPSynRetrans\s+(\d+)`).FindStringSubmatch(out)
	if m == nil {
		l.t.Fatalf("nstat has no TcpExtTCPSynRetrans:\n%s", out)
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// onehopPlain runs an onehop command that takes no --lab (the operator
// verbs) and returns its output.
func (l *testLab) onehopPlain(args ...string) string {
	l.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := exec.CommandContext(ctx, binary, args...).CombinedOutput()
	out := string(b)
	if err != nil {
		l.t.Fatalf("onehop %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}
