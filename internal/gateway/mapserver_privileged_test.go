package gateway

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/netns/netnstest"
	"github.com/onehop/onehop/internal/testenv"
)

// The whole control plane for real: the controller's map-server and
// map-resolver (`onehop controller --lisp-listen`, internal/lisp and the
// controller from lisp-cp) hold the operator's mapping of the data center's
// prefix; the gateway (--lisp) registers each path's EID behind that path's
// RLOC with its site key, resolves the server through the map-resolver and
// carries a download over both paths encapsulated; an address the
// map-server does not hold gets a negative answer and goes natively.
func TestPrivilegedGatewayWithTheControllersMapServer(t *testing.T) {
	testenv.RequireTool(t, "ip", "nft")
	// Shaped, so each path is a bottleneck and both must carry their
	// share: on unshaped veths MPTCP's scheduler may put almost all of a
	// download on the subflow with the lower RTT.
	l, _ := newLISPLab(t, "100mbit")
	dir := t.TempDir()
	keys := filepath.Join(dir, "lisp-sites")
	if err := os.WriteFile(keys, []byte("gw 1 gateway-site-secret 10.77.0.0/24\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(dir, "gw.key")
	if err := os.WriteFile(keyFile, []byte("gateway-site-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	api := filepath.Join(dir, "api.sock")
	ctlLog := &testenv.Buffer{}
	ctl := netnstest.Start(t, "the controller", ctlLog, exec.Command(l.bin, "netns-exec", l.gw, "--", l.bin, "controller",
		"--data-dir", filepath.Join(dir, "etcd"), "--client-url", "http://127.0.0.1:23790",
		"--api-socket", api, "--lisp-listen", "127.0.0.1:4342", "--lisp-site-keys", keys,
		"--insecure")) /* loopback of a test namespace: no TLS needed */
	onehop := func(args ...string) (string, error) {
		out, err := exec.Command(l.bin, append([]string{"--api", api}, args...)...).CombinedOutput()
		return string(out), err
	}
	ctl.Ready(t, 60*time.Second, func() error {
		out, err := onehop("lisp", "map", "add", "10.88.0.0/24", "--rloc", "192.168.71.2,1,50", "--rloc", "192.168.72.2,1,50")
		if err != nil {
			return fmt.Errorf("lisp map add: %v: %s", err, out)
		}
		return nil
	})

	blob := make([]byte, 32<<20)
	if _, err := rand.Read(blob); err != nil {
		t.Fatal(err)
	}
	l.serve(t, srvEID+":5201", true, blob)
	l.serve(t, srvUnmapped+":5201", false, blob[:1<<20])
	l.start(t, "--lisp", "--map-resolver", "127.0.0.1:4342",
		"--map-server", "127.0.0.1:4342", "--map-server-key-file", keyFile, "--key-id", "1")

	/* the gateway's registration: each EID behind its path's RLOC */
	type mapping struct {
		EID      string `json:"eid"`
		Source   string `json:"source"`
		Locators []struct {
			Addr string `json:"addr"`
		} `json:"locators"`
	}
	want := map[string]string{gwEID1 + "/32": "192.168.71.1", gwEID2 + "/32": "192.168.72.1"}
	testenv.Eventually(t, "the map-server to hold the gateway's registrations", 20*time.Second, func() error {
		out, err := onehop("lisp", "map", "list", "-o", "json")
		if err == nil {
			var ms []mapping
			if jerr := json.Unmarshal([]byte(out), &ms); jerr != nil {
				var wrapped struct{ Mappings []mapping }
				if json.Unmarshal([]byte(out), &wrapped) == nil {
					ms = wrapped.Mappings
				}
			}
			found := 0
			for _, m := range ms {
				if rloc, ok := want[m.EID]; ok && m.Source == "register" && len(m.Locators) == 1 && m.Locators[0].Addr == rloc {
					found++
				}
			}
			if found == len(want) {
				return nil
			}
		}
		return testenv.WithLogs(fmt.Errorf("want %v; last list (%v):\n%s\nthe gateway's log, then the controller's:", want, err, out), l.logs, ctlLog)
	})

	d := l.download(t, srvEID+":5201")
	d.waitBytes(t, 1, l.logs)
	l.conn(t, srvEID+":5201", func(c ConnStatus) bool { return liveOn(c, "wan1") && liveOn(c, "wan2") })
	a1, a2 := lispBytes(t, l)
	d.wait(t, blob, l.logs)
	b1, b2 := lispBytes(t, l)
	if b1-a1 < 1<<20 || b2-a2 < 1<<20 {
		t.Fatalf("the gateway decapsulated %d and %d bytes on wan1 and wan2: want both paths", b1-a1, b2-a2)
	}
	c := l.conn(t, srvEID+":5201", func(c ConnStatus) bool { return !c.Open })
	if c.EID != "10.88.0.0/24" || len(c.Locators) != 2 {
		t.Fatalf("status: the record from the map-resolver: %+v", c)
	}
	d = l.download(t, srvUnmapped+":5201")
	d.wait(t, blob[:1<<20], l.logs)
	c = l.conn(t, srvUnmapped+":5201", func(c ConnStatus) bool { return !c.Open })
	if c.Mode != ModeNative || !strings.Contains(c.Why, "negative") {
		t.Fatalf("unmapped: want native after the map-resolver's negative answer: %+v", c)
	}
	l.stop(t)
}
