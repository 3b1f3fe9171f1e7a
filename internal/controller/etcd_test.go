package controller

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/testenv"
)

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func writeTopo(t *testing.T) string {
	p := filepath.Join(t.TempDir(), "t.yaml")
	if err := os.WriteFile(p, []byte(topo), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// runUntilVMs runs the controller daemon and waits until the topology's VMs
// can be read through endpoints (with tc, if not nil). The controller stops
// when the test ends.
func runUntilVMs(t *testing.T, cfg DaemonConfig, readFrom []string, tc *tls.Config) {
	t.Helper()
	done := startController(t, cfg)
	waitVMs(t, done, readFrom, tc)
}

// startController runs the controller daemon until the test ends; the
// channel reports if it exits before.
func startController(t *testing.T, cfg DaemonConfig) <-chan error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	exited := make(chan error, 1)
	go func() {
		err := RunDaemon(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
		exited <- err
		done <- err
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("controller: %v", err)
		}
	})
	return exited
}

// waitVMs waits until the topology's VMs can be read through endpoints.
func waitVMs(t *testing.T, exited <-chan error, readFrom []string, tc *tls.Config) {
	t.Helper()
	ctx := t.Context()
	s, err := store.DialEtcdTLS(readFrom, tc)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	testenv.Eventually(t, "the 3 VMs in etcd", 20*time.Second, func() error {
		select {
		case err := <-exited:
			t.Fatalf("controller exited: %v", err)
		default:
		}
		cctx, ccancel := context.WithTimeout(ctx, time.Second)
		vms, _, err := store.ListJSON[intent.VM](cctx, s, intent.VMsPrefix)
		ccancel()
		if err == nil && len(vms) != 3 {
			err = fmt.Errorf("%d VMs", len(vms))
		}
		return err
	})
}

func TestEmbeddedEtcdServesAgentsOverTCPAndToolsOverUnixSocket(t *testing.T) {
	dir := t.TempDir()
	clientURL := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	socket := filepath.Join(dir, "etcd.sock")
	cfg := DaemonConfig{DataDir: filepath.Join(dir, "etcd"), ClientURL: clientURL, Socket: socket,
		PeerURL: fmt.Sprintf("http://127.0.0.1:%d", freePort(t)), Topology: writeTopo(t), Insecure: true}
	exited := startController(t, cfg)
	waitVMs(t, exited, []string{"unix://" + socket}, nil)
	waitVMs(t, exited, []string{clientURL}, nil)
}

func TestControllerUsesAnExternalEtcdCluster(t *testing.T) {
	bin, err := exec.LookPath("etcd")
	if err != nil {
		testenv.Missing(t, "needs an etcd binary on PATH (Debian etcd-server; make deps installs it): %v", err)
	}
	client := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	peer := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	cmd := exec.Command(bin, "--data-dir", filepath.Join(t.TempDir(), "ext"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "default="+peer)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	runUntilVMs(t, DaemonConfig{EtcdEndpoints: []string{client}, Topology: writeTopo(t), Insecure: true}, []string{client}, nil)
}

// A controller told to stop before it has finished starting (here: before
// it has even read the store) stops cleanly: the context's end is a
// shutdown, not a startup failure to report.
func TestAControllerStoppedWhileStartingReportsNoFailure(t *testing.T) {
	dir := t.TempDir()
	cfg := DaemonConfig{DataDir: filepath.Join(dir, "etcd"), ClientURL: fmt.Sprintf("http://127.0.0.1:%d", freePort(t)),
		Socket: filepath.Join(dir, "etcd.sock"), PeerURL: fmt.Sprintf("http://127.0.0.1:%d", freePort(t)),
		Topology: writeTopo(t), Insecure: true}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := RunDaemon(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
		t.Fatalf("stopped while starting: %v, want a clean stop", err)
	}
	// A startup that fails for its own reason still says so.
	bad := cfg
	bad.Topology = filepath.Join(dir, "missing.yaml")
	if err := RunDaemon(t.Context(), bad, slog.New(slog.NewTextHandler(io.Discard, nil))); err == nil {
		t.Fatal("a missing topology file: no error")
	}
}
