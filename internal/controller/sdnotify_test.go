package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/sdnotify/sdnotifytest"
)

// Under systemd (Type=notify) the controller says READY=1 only once its
// API answers: the moment the datagram arrives, a request on the API's
// socket succeeds. STOPPING=1 follows when it is told to stop.
func TestTheControllerTellsSystemdItIsReadyOnceItsAPIAnswers(t *testing.T) {
	dir := t.TempDir()
	notify := sdnotifytest.Listen(t)
	api := filepath.Join(dir, "api.sock")
	cfg := DaemonConfig{DataDir: filepath.Join(dir, "etcd"), ClientURL: fmt.Sprintf("http://127.0.0.1:%d", freePort(t)),
		PeerURL: fmt.Sprintf("http://127.0.0.1:%d", freePort(t)), APISocket: api, Topology: writeTopo(t), Insecure: true}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- RunDaemon(ctx, cfg, quietLog()) }()
	defer func() { cancel(); <-done }()

	if got := notify.Receive(30 * time.Second); got != "READY=1\nSTATUS=serving the REST API\n" {
		t.Fatalf("first notification %q, want READY=1 with its status", got)
	}
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", api)
		}}}
	resp, err := hc.Get("http://controller/v1/vms")
	if err != nil {
		t.Fatalf("READY=1 was sent, but the API does not answer: %v", err)
	}
	var vms []map[string]any
	derr := json.NewDecoder(resp.Body).Decode(&vms)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || derr != nil {
		t.Fatalf("READY=1 was sent, but GET /v1/vms answers %s (%v)", resp.Status, derr)
	}
	// The topology file seeds the store before the API serves.
	if len(vms) != 3 {
		t.Fatalf("READY=1 was sent with %d of the topology's 3 VMs in intent", len(vms))
	}

	cancel()
	if err := <-done; err != nil {
		t.Fatalf("controller: %v", err)
	}
	done <- nil // for the deferred wait
	if got := notify.Receive(5 * time.Second); got != "STOPPING=1\n" {
		t.Fatalf("after the stop: %q; want STOPPING=1", got)
	}
}
