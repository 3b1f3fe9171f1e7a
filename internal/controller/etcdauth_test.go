package controller

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/onehop/onehop/internal/client"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/pki"
	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/testenv"
)

// issueClient signs a client certificate with CN cn by p's CA.
func issueClient(t *testing.T, p testPKI, cn string) pki.Files {
	t.Helper()
	ca, err := pki.LoadCA(p.controller.CA, strings.TrimSuffix(p.controller.CA, ".crt")+".key")
	if err != nil {
		t.Fatal(err)
	}
	pair, err := ca.Issue(pki.Request{Kind: pki.Client, CommonName: cn}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	f := pki.Files{CA: p.controller.CA, Cert: filepath.Join(dir, cn+".crt"), Key: filepath.Join(dir, cn+".key")}
	if err := pair.Write(f.Cert, f.Key); err != nil {
		t.Fatal(err)
	}
	return f
}

func dialAs(t *testing.T, url string, f pki.Files) *store.Etcd {
	t.Helper()
	s, err := store.DialEtcdTLS([]string{url}, clientTLS(t, f))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// etcdOp is one request a certificate makes, and whether etcd must take it.
type etcdOp struct {
	what string
	do   func(ctx context.Context, s *store.Etcd) error
	ok   bool
}

func put(key string, ok bool) etcdOp {
	return etcdOp{"put " + key, func(ctx context.Context, s *store.Etcd) error { return s.Put(ctx, key, []byte(`{}`)) }, ok}
}

func del(key string, ok bool) etcdOp {
	return etcdOp{"delete " + key, func(ctx context.Context, s *store.Etcd) error { return s.Delete(ctx, key) }, ok}
}

func list(prefix string, ok bool) etcdOp {
	return etcdOp{"list " + prefix, func(ctx context.Context, s *store.Etcd) error {
		_, _, err := s.List(ctx, prefix)
		return err
	}, ok}
}

// checkOps makes every op as s and checks etcd's answer: taken, or refused
// for want of permission (not for any other reason).
func checkOps(t *testing.T, who string, s *store.Etcd, ops []etcdOp) {
	t.Helper()
	for _, op := range ops {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		err := op.do(ctx, s)
		cancel()
		switch {
		case op.ok && err != nil:
			t.Errorf("%s: %s: %v, want it taken", who, op.what, err)
		case !op.ok && !errors.Is(err, rpctypes.ErrPermissionDenied):
			t.Errorf("%s: %s: %v, want etcd's %q", who, op.what, err, rpctypes.ErrPermissionDenied)
		}
	}
}

// agentOps are what h1's agent certificate may and may not do in the
// store of the test topology (hosts h1 and h2; web1 on h1, the rest on h2).
func agentOps() []etcdOp {
	return []etcdOp{
		// Its own two records.
		put(intent.StatusPrefix+"h1", true),
		put(intent.NodesPrefix+"h1", true),
		// What it reads.
		list(intent.DesiredHostPrefix("h1"), true),
		list(intent.FarmStatePrefix, true),
		list(intent.NodesPrefix, true),
		list(intent.VMsPrefix, true),
		// Another host's records, whether it exists or not, and a host
		// whose name h1's begins.
		put(intent.StatusPrefix+"h2", false),
		put(intent.NodesPrefix+"h2", false),
		del(intent.StatusPrefix+"h2", false),
		put(intent.StatusPrefix+"h10", false),
		put(intent.StatusPrefix+"h1/x", false),
		// Intent and desired state, its own host's too.
		put(intent.HostsPrefix+"h1", false),
		put(intent.VMKey("blue", "web", "evil"), false),
		put(intent.FarmsPrefix+"blue", false),
		put(intent.DesiredVMKey("h1", "blue/web/web1"), false),
		put(intent.DesiredVMKey("h2", "blue/web/web2"), false),
		del(intent.DesiredVMKey("h2", "blue/web/web2"), false),
		put(intent.FarmStateKey(1), false),
		put(intent.LISPMappingsPrefix+"x", false),
		put(intent.VNATLocationsPrefix+"x", false),
		// Another host's desired state, and the intent it does not need.
		list(intent.DesiredHostPrefix("h2"), false),
		list(intent.FarmsPrefix, false),
		list(intent.Root, false),
		list(intent.StatusPrefix, false),
	}
}

// confinesAgents proves, against a controller serving etcd at url and the
// API on apiSocket, that each host's agent certificate writes only its own
// host's status and node records while the controller's writes everything;
// that a certificate of the CA naming no host does nothing; and that a host
// added later gets its user and a host removed loses it.
func confinesAgents(t *testing.T, p testPKI, url, apiSocket string) {
	h1 := dialAs(t, url, p.agent)
	checkOps(t, "h1's agent", h1, agentOps())
	// h2's reads what is h2's, and h1's status is not its to write.
	h2 := dialAs(t, url, issueClient(t, p, "h2"))
	checkOps(t, "h2's agent", h2, []etcdOp{
		put(intent.StatusPrefix+"h2", true),
		list(intent.DesiredHostPrefix("h2"), true),
		put(intent.StatusPrefix+"h1", false),
		list(intent.DesiredHostPrefix("h1"), false),
	})
	// The controller writes intent and desired state (its administrator).
	checkOps(t, "the controller", dialAs(t, url, p.controller), []etcdOp{
		put(intent.DesiredVMKey("h2", "blue/web/x"), true),
		del(intent.DesiredVMKey("h2", "blue/web/x"), true),
		put(intent.StatusPrefix+"h2", true),
		list(intent.Root, true),
	})
	// Signed by the CA, but no host: an operator's certificate, say.
	checkOps(t, "a certificate of no host", dialAs(t, url, issueClient(t, p, "ops")), []etcdOp{
		list(intent.VMsPrefix, false),
		put(intent.StatusPrefix+"ops", false),
	})

	// A host added later: its certificate gets in as soon as the host
	// exists, and is refused again once it is removed (its status gone).
	h3 := dialAs(t, url, issueClient(t, p, "h3"))
	checkOps(t, "h3's agent before h3 exists", h3, []etcdOp{put(intent.StatusPrefix+"h3", false)})
	api := client.New(apiSocket)
	testenv.Eventually(t, "the API to answer", 20*time.Second, func() error {
		return api.Do("GET", "/v1/hosts", nil, nil)
	})
	if err := api.Do("POST", "/v1/hosts", intent.Host{Name: "h3"}, nil); err != nil {
		t.Fatal(err)
	}
	checkOps(t, "h3's agent", h3, []etcdOp{put(intent.StatusPrefix+"h3", true), put(intent.StatusPrefix+"h1", false)})
	if err := api.Do("DELETE", "/v1/hosts/h3", nil, nil); err != nil {
		t.Fatal(err)
	}
	checkOps(t, "h3's agent after h3 is removed", h3, []etcdOp{put(intent.StatusPrefix+"h3", false), list(intent.VMsPrefix, false)})
	if _, err := dialAs(t, url, p.controller).Get(t.Context(), intent.StatusPrefix+"h3"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("removed host h3's status: %v, want it gone", err)
	}
	// No host may be etcd's administrator by name.
	err := api.Do("POST", "/v1/hosts", intent.Host{Name: "root"}, nil)
	if err == nil || !strings.Contains(err.Error(), "administrator") {
		t.Errorf("a host named root: %v, want it refused", err)
	}
}

func TestAnAgentCertificateWritesOnlyItsOwnHostsKeysInTheEmbeddedEtcd(t *testing.T) {
	p, clientURL, _, apiSocket, etcdSocket := tlsController(t)
	confinesAgents(t, p, clientURL, apiSocket)
	// Local tools on the unix socket are the controller: they write
	// anything, as before auth.
	local, err := store.DialEtcd([]string{"unix://" + etcdSocket})
	if err != nil {
		t.Fatal(err)
	}
	defer local.Close()
	checkOps(t, "a tool on the unix socket", local, []etcdOp{
		put(intent.StatusPrefix+"h2", true),
		list(intent.Root, true),
	})
}

// A controller restarted on a store whose auth is on (it turned it on)
// is its administrator still, and the hosts' users are as they were.
func TestARestartedControllerKeepsEtcdAuth(t *testing.T) {
	p := makePKI(t)
	dir := t.TempDir()
	clientURL := fmt.Sprintf("https://127.0.0.1:%d", freePort(t))
	cfg := DaemonConfig{DataDir: filepath.Join(dir, "etcd"), ClientURL: clientURL, Socket: filepath.Join(dir, "etcd.sock"),
		PeerURL: fmt.Sprintf("http://127.0.0.1:%d", freePort(t)), Topology: writeTopo(t),
		APISocket: filepath.Join(dir, "api.sock"), TLS: p.controller}
	for i := range 2 {
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- RunDaemon(ctx, cfg, discard) }()
		waitVMs(t, done, []string{clientURL}, clientTLS(t, p.agent))
		checkOps(t, fmt.Sprintf("h1's agent (controller start %d)", i+1), dialAs(t, clientURL, p.agent), agentOps())
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("controller start %d: %v", i+1, err)
		}
	}
	// An --insecure controller is no etcd user: it says so at start.
	insecure := cfg
	insecure.TLS, insecure.Insecure = pki.Files{}, true
	insecure.ClientURL = strings.Replace(clientURL, "https://", "http://", 1)
	err := RunDaemon(t.Context(), insecure, discard)
	if err == nil || !strings.Contains(err.Error(), "authentication on") {
		t.Errorf("an --insecure controller on a store with auth: %v, want it refused", err)
	}
}

// The same with an external etcd (Debian's, 3.4: no AuthStatus) that
// takes client certificates: the controller turns its auth on.
func TestAnAgentCertificateWritesOnlyItsOwnHostsKeysInAnExternalEtcd(t *testing.T) {
	p := makePKI(t)
	url := externalEtcd(t, p)
	apiSocket := filepath.Join(t.TempDir(), "api.sock")
	runUntilVMs(t, DaemonConfig{EtcdEndpoints: []string{url}, Topology: writeTopo(t), TLS: p.controller, APISocket: apiSocket},
		[]string{url}, clientTLS(t, p.agent))
	confinesAgents(t, p, url, apiSocket)
}
