package vnatd

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/vcmp"
)

func TestParseTuple(t *testing.T) {
	good, err := ParseTuple("tcp 10.0.1.1:40000->10.0.2.2:22")
	if err != nil || good.Proto != vcmp.TCP || good.Local.String() != "10.0.1.1:40000" || good.Remote.String() != "10.0.2.2:22" {
		t.Fatalf("ParseTuple: %+v, %v", good, err)
	}
	if u, err := ParseTuple(" UDP 10.0.1.1:5 -> 10.0.2.2:6 "); err != nil || u.Proto != vcmp.UDP {
		t.Fatalf("udp with spaces: %+v, %v", u, err)
	}
	for in, want := range map[string]string{
		"10.0.1.1:1->10.0.2.2:2":      "want \"tcp|udp",
		"sctp 10.0.1.1:1->10.0.2.2:2": `protocol "sctp"`,
		"tcp 10.0.1.1:1 10.0.2.2:2":   `no "->"`,
		"tcp 10.0.1:1->10.0.2.2:2":    "local end",
		"tcp 10.0.1.1:1->10.0.2.2":    "remote end",
	} {
		if _, err := ParseTuple(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseTuple(%q) = %v, want an error saying %q", in, err, want)
		}
	}
}

// The control socket: status lists the connections, suspend names one,
// and bad requests are refused with a message that says what is wrong.
func TestControlSocket(t *testing.T) {
	n := newNetwork()
	a := n.add(t, "a", "10.0.1.1", Config{})
	b := n.add(t, "b", "10.0.2.2", Config{})
	ta, _ := connect(a, b, 40000)
	syncAll(t, a, b)
	sock := filepath.Join(t.TempDir(), "c.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- a.e.ServeControl(ctx, l) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()

	r, err := Ask(sock, Request{Op: "status"})
	if err != nil || len(r.Conns) != 1 || r.Conns[0].Virtual != "10.0.1.1:40000->10.0.2.2:22" || r.Conns[0].State != "active" {
		t.Fatalf("status: %+v, %v", r, err)
	}
	if _, err := Ask(sock, Request{Op: "suspend", Conn: "tcp 10.0.1.1:40001->10.0.2.2:22"}); err == nil || !strings.Contains(err.Error(), "no active connection") {
		t.Errorf("suspend of an unknown connection: %v", err)
	}
	if _, err := Ask(sock, Request{Op: "suspend", Conn: "nonsense"}); err == nil || !strings.Contains(err.Error(), "want \"tcp|udp") {
		t.Errorf("suspend of nonsense: %v", err)
	}
	name := ta.Proto.String() + " " + ta.Local.String() + "->" + ta.Remote.String()
	if _, err := Ask(sock, Request{Op: "suspend", Conn: name, Conflict: "steal"}); err == nil || !strings.Contains(err.Error(), `conflict policy "steal": want abort or preempt`) {
		t.Errorf("suspend --conflict steal: %v", err)
	}
	if s := state(t, a, ta); s.State != "active" || s.Conflict != "abort" {
		t.Errorf("after a refused suspend: %+v, want active with the default policy abort", s)
	}
	if r, err := Ask(sock, Request{Op: "suspend", Conn: name, Conflict: "preempt"}); err != nil || r.Count != 1 {
		t.Fatalf("suspend: %+v, %v", r, err)
	}
	if s := state(t, a, ta); s.State != "suspended" || s.Role != "primary" || !s.Keyed || s.Conflict != "preempt" {
		t.Errorf("after suspend: %+v", s)
	}
	if _, err := Ask(sock, Request{Op: "frobnicate"}); err == nil || !strings.Contains(err.Error(), `unknown control request "frobnicate"`) {
		t.Errorf("unknown op: %v", err)
	}
	if _, err := Ask(filepath.Join(t.TempDir(), "none.sock"), Request{Op: "status"}); err == nil || !strings.Contains(err.Error(), "is `onehop vnat run` running") {
		t.Errorf("no daemon: %v", err)
	}
}

// A peer's daemon that does not know the connection answers "unknown" to
// the claim and the key, in one batch that stays in step: the claimer is
// primary alone, unkeyed, and the stream is not broken.
func TestSuspendWithAPeerThatDoesNotKnowTheConnection(t *testing.T) {
	n := newNetwork()
	a := n.add(t, "a", "10.0.1.1", Config{})
	b := n.add(t, "b", "10.0.2.2", Config{})
	ta, _ := connect(a, b, 40000)
	syncAll(t, a) // b never looked: it does not know the connection
	if k, err := a.e.Suspend(t.Context(), nil); err != nil || k != 1 {
		t.Fatalf("suspend: %d, %v", k, err)
	}
	if s := state(t, a, ta); s.State != "suspended" || s.Role != "primary" || s.Keyed {
		t.Errorf("after a suspend the peer did not know: %+v, want suspended primary, unkeyed", s)
	}
}

// stop is refused by a daemon that does not stop on request; one that
// does answers first, then stops (the CLI hears "stopping"), and its
// control socket goes with it.
func TestControlStopAnswersThenStops(t *testing.T) {
	n := newNetwork()
	a := n.add(t, "a", "10.0.1.1", Config{})
	sock := filepath.Join(t.TempDir(), "c.sock")
	l, err := ListenControl(sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- a.e.ServeControl(ctx, l) }()
	if _, err := Ask(sock, Request{Op: "stop"}); err == nil || err.Error() != "this daemon does not stop on request" {
		t.Fatalf("stop without OnStop: %v", err)
	}
	a.e.OnStop(cancel)
	if _, err := Ask(sock, Request{Op: "stop"}); err != nil {
		t.Fatalf("stop: %v, want an answer before the daemon goes", err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the daemon answered stop but did not stop")
	}
	if _, err := os.Lstat(sock); !os.IsNotExist(err) {
		t.Errorf("the control socket after stop: %v, want it removed", err)
	}
}
