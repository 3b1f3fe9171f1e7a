package gateway

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The control socket, as `onehop gateway run` makes it: status lists the
// paths and counters, an unknown request is refused with what is wanted,
// a missing daemon says which command starts it, and the socket is gone
// once the daemon's context ends.
func TestControlSocketAnswersStatusAndRefusesTheRest(t *testing.T) {
	cfg := validConfig()
	cfg.MaxPerClient = 1
	e := NewEngine(&cfg, EngineDeps{})
	a := netip.MustParseAddr("10.66.0.2")
	e.admit(a)
	e.admit(a) // refused: counted
	sock := filepath.Join(t.TempDir(), "gw.sock")
	l, err := ListenControl(sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- e.ServeControl(ctx, l) }()

	r, err := Ask(sock, Request{Op: "status"})
	if err != nil || len(r.Paths) != len(cfg.Paths) || r.Paths[0].Name != cfg.Paths[0].Name || r.Counters["refused_per_client"] != 1 {
		t.Fatalf("status: %+v, %v", r, err)
	}
	if _, err := Ask(sock, Request{Op: "frobnicate"}); err == nil || err.Error() != `unknown control request "frobnicate" (want status)` {
		t.Errorf("unknown op: %v", err)
	}
	if _, err := ListenControl(sock); err == nil || !strings.Contains(err.Error(), "another daemon holds") {
		t.Errorf("a second gateway on the same socket: %v, want it refused", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(sock); !os.IsNotExist(err) {
		t.Errorf("the socket after the daemon ended: %v, want it removed", err)
	}
	if _, err := Ask(sock, Request{Op: "status"}); err == nil || !strings.Contains(err.Error(), "is `onehop gateway run` running") {
		t.Errorf("no daemon: %v", err)
	}
}
