package e2e

import (
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/lab"
	"github.com/onehop/onehop/internal/testenv"
)

// TestPrivilegedFabricGetsNeitherEtcdNorTheAPIWithoutCredentials plays a
// node on the fabric (a host's namespace: what a sliver or a compromised
// machine on the underlay would be) that dials the controller's etcd and
// REST API ports. Without a certificate from the lab's CA etcd refuses the
// TLS handshake and plain HTTP gets no answer; the API answers 401 without
// the token or with a wrong one. The same requests with the agent's
// certificate or the token succeed from the same place, so the port was
// reachable and only the credentials made the difference. Meanwhile every
// agent is connected over TLS and has applied its desired state.
func TestPrivilegedFabricGetsNeitherEtcdNorTheAPIWithoutCredentials(t *testing.T) {
	testenv.RequireRoot(t, "creates network namespaces and loads BPF")
	testenv.RequireTool(t, "curl", "openssl", "tcpdump", "tshark")
	l := upLab(t, quickstart)
	st, err := lab.Load(testRoot, l.name)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(st.EtcdURL, "https://") || !strings.HasPrefix(st.APIURL, "https://") {
		t.Fatalf("lab serves etcd on %q and the API on %q; want https for both", st.EtcdURL, st.APIURL)
	}
	ca := lab.CAFile(st)
	agent := lab.TLSFiles(st, "agent-h1")
	tokenBytes, err := os.ReadFile(lab.TokenFile(st))
	if err != nil {
		t.Fatal(err)
	}
	token := strings.TrimSpace(string(tokenBytes))

	// Agents are connected: each host's agent reported, over TLS with its
	// own certificate, the state it applied.
	var r lab.Report
	if err := json.Unmarshal([]byte(l.onehop("lab", "status", "-o", "json")), &r); err != nil {
		t.Fatal(err)
	}
	vifs := map[string]int{"h1": 2, "h2": 1}
	for _, n := range r.Nodes {
		if n.Kind != "host" {
			continue
		}
		if n.Agent == nil || n.Agent.Error != "" || len(n.Agent.AttachedVifs) != vifs[n.Name] {
			t.Errorf("agent on %s not ready: %+v", n.Name, n.Agent)
		}
		delete(vifs, n.Name)
	}
	if r.APIURL != st.APIURL {
		t.Errorf("lab status says the API is at %q, the lab's state %q", r.APIURL, st.APIURL)
	}
	if len(vifs) > 0 {
		t.Errorf("lab status shows no host %v", vifs)
	}

	// The intent never crosses the fabric in clear: restart h1's agent
	// (a new TLS session; it reads its desired state and writes its status)
	// while capturing the controller's port on the fabric, then look for etcd's keys in the bytes.
	got, pcap := l.captureFile("fabric", "p-controller", "tcp.srcport", "tcp.dstport", "tcp.len")
	l.onehop("lab", "restart", "h1")
	restarted := time.Now()
	testenv.Eventually(t, "the restarted agent to report over TLS", 20*time.Second, func() bool {
		var r lab.Report
		if json.Unmarshal([]byte(l.onehop("lab", "status", "-o", "json")), &r) != nil {
			return false
		}
		for _, n := range r.Nodes {
			if n.Name == "h1" && n.Agent != nil && n.Agent.Error == "" && n.Agent.Time.After(restarted) {
				return true
			}
		}
		return false
	})
	// tcpdump gets packets from the kernel in blocks, up to a second late:
	// wait until the file holds the new session, or the check proves nothing.
	testenv.Eventually(t, "the capture to hold the agent's etcd traffic", 10*time.Second, func() bool {
		fi, err := os.Stat(pcap)
		return err == nil && fi.Size() > 4000
	})
	etcdBytes := 0
	for _, line := range got() {
		f := strings.Split(line, "\t")
		if len(f) == 3 && (f[0] == "2379" || f[1] == "2379") {
			n, _ := strconv.Atoi(f[2])
			etcdBytes += n
		}
	}
	if etcdBytes < 1000 {
		t.Errorf("the capture saw %d bytes to or from etcd's port: too few to prove anything", etcdBytes)
	}
	raw, err := os.ReadFile(pcap)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(raw), intent.Root) {
		t.Errorf("etcd keys (%q) crossed the fabric in clear (%s)", intent.Root, pcap)
	}

	curl := func(args ...string) (string, error) {
		return l.in("h1", append([]string{"curl", "-sS", "--max-time", "5"}, args...)...)
	}
	// etcd: the agent's certificate gets an answer from the fabric...
	if out, err := curl("--cacert", ca, "--cert", agent.Cert, "--key", agent.Key, st.EtcdURL+"/version"); err != nil || !strings.Contains(out, "etcdserver") {
		t.Fatalf("etcd with the agent's certificate from h1: %v\n%s", err, out)
	}
	// ...none gets a failed handshake, before any etcd code runs.
	if out, err := curl("--cacert", ca, st.EtcdURL+"/version"); err == nil || strings.Contains(out, "etcdserver") {
		t.Errorf("etcd without a client certificate: %v\n%s", err, out)
	}
	// curl only says the connection broke; openssl names the alert. TLS 1.3
	// sends it after the client's last handshake message, so openssl sends
	// a request and reads (-ign_eof) until the server closes.
	etcdHost := strings.TrimPrefix(st.EtcdURL, "https://")
	sclient := `printf 'GET /version HTTP/1.0\r\n\r\n' | openssl s_client -ign_eof -connect ` + etcdHost + " -CAfile " + ca + " 2>&1"
	if out, _ := l.in("h1", "sh", "-c", sclient); !strings.Contains(out, "alert certificate required") {
		t.Errorf("TLS handshake without a client certificate was not refused for want of one:\n%s", out)
	}
	if out, err := curl("-k", st.EtcdURL+"/version"); err == nil || strings.Contains(out, "etcdserver") {
		t.Errorf("etcd without a client certificate, not verifying the server: %v\n%s", err, out)
	}
	plainEtcd := strings.Replace(st.EtcdURL, "https://", "http://", 1)
	if out, err := curl(plainEtcd + "/version"); strings.Contains(out, "etcdserver") {
		t.Errorf("etcd over plain http answered: %v\n%s", err, out)
	}

	// The REST API: 401 without credentials or with a wrong token.
	code := func(args ...string) string {
		t.Helper()
		out, err := curl(append([]string{"-o", "/dev/null", "-w", "%{http_code}", "--cacert", ca}, args...)...)
		if err != nil {
			t.Fatalf("curl %v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(out)
	}
	vms := st.APIURL + "/v1/vms"
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"no credentials", []string{vms}, "401"},
		{"wrong token", []string{"-H", "Authorization: Bearer " + strings.Repeat("0", len(token)), vms}, "401"},
		{"a write without credentials", []string{"-X", "POST", "-d", `{"name":"evil"}`, st.APIURL + "/v1/farms"}, "401"},
		{"the token", []string{"-H", "Authorization: Bearer " + token, vms}, "200"},
		{"the agent's certificate", []string{"--cert", agent.Cert, "--key", agent.Key, vms}, "200"},
	} {
		if got := code(c.args...); got != c.want {
			t.Errorf("API with %s: HTTP %s, want %s", c.name, got, c.want)
		}
	}
	if out, _ := l.cli("get", "farms"); strings.Contains(out, "evil") {
		t.Errorf("a farm was created without credentials:\n%s", out)
	}

	// The CLI from the fabric, over https with the lab's CA and token.
	out, err := l.in("h1", binary, "get", "vms", "--api", st.APIURL, "--ca", ca, "--token-file", lab.TokenFile(st))
	if err != nil || !strings.Contains(out, "blue/web/web1") {
		t.Errorf("onehop get vms over https from h1: %v\n%s", err, out)
	}
	out, err = l.in("h1", binary, "get", "vms", "--api", st.APIURL, "--ca", ca)
	if err == nil || !strings.Contains(out, "HTTP 401") || !strings.Contains(out, "--token-file") {
		t.Errorf("onehop get vms over https without a token: %v\n%s\nwant a 401 that says what to pass", err, out)
	}
}
