package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/onehop/onehop/internal/pki"
)

// Issue 21: the REST API's throughput with per-request authorization
// against today's, target at least 0.9x. Three controllers (the real
// binary, each with its embedded etcd, TLS on loopback) hold the same seed:
// today's as it was used, the admin token and no audit trail
// (--audit-keep 0); one used by a tenant, a token of farm blue (looked up
// in the controller's copy, its farm checked on every request), no audit
// trail; and the same with the audit trail on (each entry in the
// transaction of its write: no transaction of its own), whose cost is reported
// beside, against the same target. Each round measures, on all three in
// rotated order, reads (GET /v1/vms: every VM is blue's, so the tenant's
// filtered answer is the admin's bytes) and writes (a VM created and
// deleted again on blue's subnet, counted as one), apiWorkers requests at
// a time over kept-alive connections, for the bench's -seconds each.
const apiWorkers = 4

var apiAuthzScenario = &Scenario{
	Name: "api-authz",
	Description: "REST API requests per second over https on loopback: a tenant token with authorization and the audit trail on, " +
		"against the admin token with the audit trail off (today's); reads are GET /v1/vms, writes a VM create + delete",
	Tests:  []string{}, // its figures are its checks
	Build:  func(context.Context, *Env) ([]*Pair, error) { return nil, nil },
	Checks: apiAuthzChecks,
}

const apiSeed = `name: apibench
hosts: [{name: h1}, {name: h2}]
farms:
  - name: blue
    subnets: [{name: web}]
  - name: red
    subnets: [{name: web}]
vms:
  - {name: web1, host: h1, subnet: blue/web}
  - {name: web2, host: h2, subnet: blue/web}
  - {name: web3, host: h1, subnet: blue/web}
`

// apiTarget is one controller the bench drives, with the token it uses.
type apiTarget struct {
	name  string
	url   string
	token string
	http  *http.Client
	vms   atomic.Int64 // VMs named so far: each write's name is new
}

func apiAuthzChecks(ctx context.Context, e *Env, _ []*Pair) ([]Check, error) {
	dir, err := os.MkdirTemp(e.tmp, "api-authz-")
	if err != nil {
		return nil, err
	}
	files, admin, pool, err := apiPKI(dir)
	if err != nil {
		return nil, err
	}
	seed := filepath.Join(dir, "seed.yaml")
	if err := os.WriteFile(seed, []byte(apiSeed), 0o600); err != nil {
		return nil, err
	}
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, MaxIdleConnsPerHost: apiWorkers}
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	defer tr.CloseIdleConnections()
	today, err := startAPIController(ctx, e, dir, "today", files, seed, "0")
	if err != nil {
		return nil, err
	}
	authz, err := startAPIController(ctx, e, dir, "authz", files, seed, "0")
	if err != nil {
		return nil, err
	}
	audited, err := startAPIController(ctx, e, dir, "audited", files, seed, "10000")
	if err != nil {
		return nil, err
	}
	targets := []*apiTarget{{name: "admin, no audit", url: today, token: admin, http: client},
		{name: "tenant blue, no audit", url: authz, token: admin, http: client},
		{name: "tenant blue, audited", url: audited, token: admin, http: client}}
	for _, t := range targets[1:] {
		var tok struct{ Token string }
		if err := t.do(ctx, "POST", "/v1/tenants/tokens", `{"farm":"blue"}`, 201, &tok); err != nil {
			return nil, fmt.Errorf("tenant token: %w", err)
		}
		t.token = tok.Token
		// The tenant's token is what it says: red's objects are refused.
		if err := t.do(ctx, "POST", "/v1/farms/red/subnets/web/vms", `{"name":"x1","host":"h1"}`, 403, nil); err != nil {
			return nil, fmt.Errorf("the tenant token on red's farm: %w", err)
		}
	}
	window := time.Duration(e.cfg.seconds) * time.Second
	kinds := []struct {
		name string
		run  func(context.Context, *apiTarget, int, int) error
	}{{"reads", apiRead}, {"writes", apiWrite}}
	rates := map[string][][]float64{} // kind -> target -> per round
	for r := 0; r < e.cfg.rounds; r++ {
		for _, k := range kinds {
			if rates[k.name] == nil {
				rates[k.name] = make([][]float64, len(targets))
			}
			for _, i := range Rotation(len(targets), r) {
				n, err := apiLoad(ctx, targets[i], window, k.run)
				if err != nil {
					return nil, fmt.Errorf("round %d: %s on %s: %w", r+1, k.name, targets[i].name, err)
				}
				rate := float64(n) / window.Seconds()
				rates[k.name][i] = append(rates[k.name][i], rate)
				progress("round %d/%d: api-authz %-6s %-22s %8.0f requests/s", r+1, e.cfg.rounds, k.name, targets[i].name, rate)
			}
		}
	}
	var out []Check
	for _, k := range kinds {
		base := Summarize(rates[k.name][0])
		for i, what := range []string{"tenant over today's", "tenant, audited, over today's"} {
			with := Summarize(rates[k.name][i+1])
			ratio := round3(with.Median / base.Median)
			met := ratio >= 0.9
			out = append(out, Check{Scenario: "api-authz", Name: k.name + ", " + what, Value: ratio, Unit: "x", Op: ">=", Target: 0.9, Met: &met,
				Detail: fmt.Sprintf("medians of %d rounds of %s, %d at a time: %.0f/s as %s; %.0f/s as %s (min-max %.0f-%.0f and %.0f-%.0f)",
					with.N, window, apiWorkers, with.Median, targets[i+1].name, base.Median, targets[0].name, with.Min, with.Max, base.Min, base.Max)})
		}
	}
	return out, nil
}

// apiLoad runs op with apiWorkers workers for window and counts the
// requests answered as expected.
func apiLoad(ctx context.Context, t *apiTarget, window time.Duration, op func(context.Context, *apiTarget, int, int) error) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, window)
	defer cancel()
	var n atomic.Int64
	var wg sync.WaitGroup
	errs := make([]error, apiWorkers)
	for w := 0; w < apiWorkers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ctx.Err() == nil; i++ {
				if err := op(ctx, t, w, i); err != nil {
					if ctx.Err() == nil {
						errs[w] = err
						cancel()
					}
					return
				}
				n.Add(1)
			}
		}()
	}
	wg.Wait()
	return n.Load(), errors.Join(errs...)
}

func apiRead(ctx context.Context, t *apiTarget, _, _ int) error {
	return t.do(ctx, "GET", "/v1/vms", "", 200, nil)
}

// apiWrite creates a VM on blue's subnet and deletes it: two writes, each
// compiled into desired state and (tenant) audited. It counts as one.
func apiWrite(ctx context.Context, t *apiTarget, _, _ int) error {
	// A write the window cut short leaves its VM: the next name is new.
	name := fmt.Sprintf("v%d", t.vms.Add(1))
	if err := t.do(ctx, "POST", "/v1/farms/blue/subnets/web/vms", `{"name":"`+name+`","host":"h1"}`, 201, nil); err != nil {
		return err
	}
	return t.do(ctx, "DELETE", "/v1/farms/blue/subnets/web/vms/"+name, "", 204, nil)
}

func (t *apiTarget) do(ctx context.Context, method, path, body string, want int, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, t.url+path, bytes.NewReader([]byte(body)))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+t.token)
	resp, err := t.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		return fmt.Errorf("%s %s: %d %s, want %d", method, path, resp.StatusCode, b, want)
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}

// apiPKI makes a CA, the controllers' certificate for 127.0.0.1 and the
// admin token, in dir.
func apiPKI(dir string) (pki.Files, string, *x509.CertPool, error) {
	now := time.Now()
	ca, err := pki.NewCA("api-bench", now, 24*time.Hour)
	if err != nil {
		return pki.Files{}, "", nil, err
	}
	f := pki.Files{CA: filepath.Join(dir, "ca.crt"), Cert: filepath.Join(dir, "controller.crt"), Key: filepath.Join(dir, "controller.key")}
	if err := ca.Write(f.CA, filepath.Join(dir, "ca.key")); err != nil {
		return f, "", nil, err
	}
	p, err := ca.Issue(pki.Request{Kind: pki.Server, CommonName: "controller", IPs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}}, now)
	if err != nil {
		return f, "", nil, err
	}
	if err := p.Write(f.Cert, f.Key); err != nil {
		return f, "", nil, err
	}
	tok, err := pki.NewToken()
	if err != nil {
		return f, "", nil, err
	}
	if err := pki.WriteToken(filepath.Join(dir, "api-token"), tok); err != nil {
		return f, "", nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	return f, tok, pool, nil
}

// freePorts returns n TCP ports free on loopback now.
func freePorts(n int) ([]int, error) {
	var out []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
}

// startAPIController runs `onehop controller` on loopback with its own
// embedded etcd and returns its API's URL once it answers; it is stopped
// at cleanup.
func startAPIController(ctx context.Context, e *Env, dir, name string, f pki.Files, seed, auditKeep string) (string, error) {
	ports, err := freePorts(3)
	if err != nil {
		return "", err
	}
	api := fmt.Sprintf("127.0.0.1:%d", ports[2])
	log, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		return "", err
	}
	cctx, cancel := context.WithCancel(context.Background())
	cmd := command(cctx, e.cfg.binary, "controller", "--data-dir", filepath.Join(dir, name+"-etcd"),
		"--client-url", fmt.Sprintf("https://127.0.0.1:%d", ports[0]), "--peer-url", fmt.Sprintf("http://127.0.0.1:%d", ports[1]),
		"--api-listen", api, "--location-listen", "", "--metrics-addr", "", "--topology", seed, "--audit-keep", auditKeep,
		"--tls-ca", f.CA, "--tls-cert", f.Cert, "--tls-key", f.Key, "--api-token-file", filepath.Join(dir, "api-token"))
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		cancel()
		log.Close()
		return "", fmt.Errorf("start controller %s: %w", name, err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); log.Close(); close(done) }()
	e.OnCleanup(func() error {
		cancel()
		<-done
		return nil
	})
	url := "https://" + api
	pool := x509.NewCertPool()
	caPEM, err := os.ReadFile(f.CA)
	if err != nil {
		return "", err
	}
	pool.AppendCertsFromPEM(caPEM)
	tok, err := pki.ReadToken(filepath.Join(dir, "api-token"))
	if err != nil {
		return "", err
	}
	probe := &apiTarget{url: url, token: tok, http: &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}, Timeout: 2 * time.Second}}
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := probe.do(ctx, "GET", "/v1/vms", "", 200, nil)
		if err == nil {
			return url, nil
		}
		select {
		case <-done:
			b, _ := os.ReadFile(log.Name())
			return "", fmt.Errorf("controller %s exited: %s", name, b)
		case <-ctx.Done():
			return "", context.Cause(ctx)
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("controller %s: API not answering after 30 s: %w", name, err)
		}
	}
}
