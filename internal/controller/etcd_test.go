package controller

import (
	"context"
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
)

func freePort(t *testing.T) int {
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
// can be read through endpoints.
func runUntilVMs(t *testing.T, cfg DaemonConfig, readFrom []string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- RunDaemon(ctx, cfg, slog.New(slog.NewTextHandler(io.Discard, nil))) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("controller: %v", err)
		}
	}()
	s, err := store.DialEtcd(readFrom)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	deadline := time.Now().Add(20 * time.Second)
	for {
		select {
		case err := <-done:
			t.Fatalf("controller exited: %v", err)
		default:
		}
		cctx, ccancel := context.WithTimeout(ctx, time.Second)
		vms, _, err := store.ListJSON[intent.VM](cctx, s, intent.VMsPrefix)
		ccancel()
		if err == nil && len(vms) == 3 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("VMs not in etcd after 20s (last: %d, %v)", len(vms), err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestEmbeddedEtcdServesAgentsOverTCPAndToolsOverUnixSocket(t *testing.T) {
	dir := t.TempDir()
	clientURL := fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	socket := filepath.Join(dir, "etcd.sock")
	cfg := DaemonConfig{DataDir: filepath.Join(dir, "etcd"), ClientURL: clientURL, Socket: socket,
		PeerURL: fmt.Sprintf("http://127.0.0.1:%d", freePort(t)), Topology: writeTopo(t)}
	runUntilVMs(t, cfg, []string{"unix://" + socket})
}

func TestControllerUsesAnExternalEtcdCluster(t *testing.T) {
	bin, err := exec.LookPath("etcd")
	if err != nil {
		t.Fatal("etcd binary not installed (Debian etcd-server; make deps installs it)")
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
	runUntilVMs(t, DaemonConfig{EtcdEndpoints: []string{client}, Topology: writeTopo(t)}, []string{client})
}
