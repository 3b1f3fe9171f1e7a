package ctlsock

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

type request struct {
	Op string `json:"op"`
	N  int    `json:"n,omitempty"`
}

type reply struct {
	Error string `json:"error,omitempty"`
	Echo  string `json:"echo,omitempty"`
	Count int    `json:"count,omitempty"`
}

func handle(_ context.Context, r request) (reply, error) {
	switch r.Op {
	case "echo":
		return reply{Echo: strings.Repeat("x", r.N)}, nil
	case "partial": // an error beside a result, as vnatd's suspend sends
		return reply{Count: 2}, errors.New("2 of 3 done")
	}
	return reply{}, fmt.Errorf("unknown control request %q", r.Op)
}

// serve runs s on a fresh socket until the test ends (or cancel); done
// gives Serve's result.
func serve(t *testing.T, s *Server[request, reply]) (path string, cancel context.CancelFunc, done chan error) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "c.sock")
	l, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done = make(chan error, 1)
	go func() { done <- s.Serve(ctx, l) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return path, cancel, done
}

func ask(path string, r request) (reply, error) { return Ask[request, reply](path, r, 5*time.Second) }

// mustServe proves the daemon still answers.
func mustServe(t *testing.T, path string) {
	t.Helper()
	if r, err := ask(path, request{Op: "echo", N: 3}); err != nil || r.Echo != "xxx" {
		t.Fatalf("the daemon no longer answers: %+v, %v", r, err)
	}
}

func TestAskGetsTheHandlersReply(t *testing.T) {
	path, _, _ := serve(t, &Server[request, reply]{Handle: handle})
	mustServe(t, path)
	// A reply of 100 kB: only requests are bounded.
	if r, err := ask(path, request{Op: "echo", N: 100_000}); err != nil || len(r.Echo) != 100_000 {
		t.Fatalf("long reply: %d bytes, %v", len(r.Echo), err)
	}
	r, err := ask(path, request{Op: "partial"})
	var re *RemoteError
	if !errors.As(err, &re) || err.Error() != "2 of 3 done" || r.Count != 2 || r.Error != "2 of 3 done" {
		t.Fatalf("an error beside a result: %+v, %v; want count 2 and the error, as a RemoteError", r, err)
	}
}

func TestUnknownOpIsTheHandlersErrorAtTheClient(t *testing.T) {
	path, _, _ := serve(t, &Server[request, reply]{Handle: handle})
	_, err := ask(path, request{Op: "frobnicate"})
	var re *RemoteError
	if !errors.As(err, &re) || err.Error() != `unknown control request "frobnicate"` {
		t.Fatalf("unknown op: %v (%T), want the handler's error as a RemoteError", err, err)
	}
	mustServe(t, path)
}

// Requests that are not JSON, have fields the request has not, or carry
// two values are refused before the handler sees them.
func TestBadRequestsAreRefusedWithAReason(t *testing.T) {
	called := 0
	path, _, _ := serve(t, &Server[request, reply]{Handle: func(ctx context.Context, r request) (reply, error) {
		called++
		return handle(ctx, r)
	}})
	for line, want := range map[string]string{
		"status\n":                        "bad request: invalid character 's'",
		`{"op":"echo","nn":3}` + "\n":     `bad request: json: unknown field "nn"`,
		`{"op":"echo"} {"op":"x"}` + "\n": "bad request: more than one JSON value",
	} {
		if got := raw(t, path, line); !strings.Contains(got, want) {
			t.Errorf("%q: reply %q, want %q", line, got, want)
		}
	}
	if called != 0 {
		t.Errorf("the handler saw %d bad requests", called)
	}
	mustServe(t, path)
}

// dial connects to path as a raw client, closed when the test ends; every
// wait on it gives up after 10 s.
func dial(t *testing.T, path string) net.Conn {
	t.Helper()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if err := c.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	return c
}

// raw sends line as it is and returns the error of the reply.
func raw(t *testing.T, path, line string) string {
	t.Helper()
	c := dial(t, path)
	if _, err := io.WriteString(c, line); err != nil {
		t.Fatal(err)
	}
	got, err := bufio.NewReader(c).ReadBytes('\n')
	if err != nil {
		t.Fatalf("reply to %q: %v", line, err)
	}
	var r reply
	if err := json.Unmarshal(got, &r); err != nil {
		t.Fatalf("reply to %q: %q: %v", line, got, err)
	}
	return r.Error
}

// A client that sends an endless line is answered once the line passes
// the bound and cut off; the daemon read no more than the bound, and
// still answers others.
func TestEndlessRequestRefusedAndTheDaemonStillServes(t *testing.T) {
	path, _, _ := serve(t, &Server[request, reply]{Handle: handle, MaxRequest: 1024})
	c := dial(t, path)
	wrote := make(chan error, 1)
	go func() {
		chunk := []byte(`{"op":"` + strings.Repeat("a", 4096))
		for {
			if _, err := c.Write(chunk); err != nil {
				wrote <- err
				return
			}
		}
	}()
	got, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || !strings.Contains(got, "request refused: longer than 1024 bytes") {
		t.Fatalf("reply to an endless line: %q, %v", got, err)
	}
	// The daemon hung up: the writer stops with an error, not the deadline.
	if err := <-wrote; errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("the daemon kept reading the endless line: %v", err)
	}
	mustServe(t, path)

	// Ask itself shows the refusal, not just the broken pipe it met.
	_, err = ask(path, request{Op: strings.Repeat("b", 1<<20)})
	var re *RemoteError
	if !errors.As(err, &re) || !strings.Contains(err.Error(), "longer than 1024 bytes") {
		t.Fatalf("Ask with an oversize request: %v, want the daemon's refusal", err)
	}
	mustServe(t, path)
}

// A client that connects and says nothing is told so and dropped after
// Timeout.
func TestSilentClientDroppedAfterTheTimeout(t *testing.T) {
	path, _, _ := serve(t, &Server[request, reply]{Handle: handle, Timeout: 100 * time.Millisecond})
	c := dial(t, path)
	start := time.Now()
	got, err := io.ReadAll(c) // until the daemon closes
	if err != nil {
		t.Fatalf("the daemon held a silent client for %v: %v", time.Since(start), err)
	}
	if !strings.Contains(string(got), "no request within 100ms") {
		t.Errorf("said to a silent client: %q", got)
	}
	mustServe(t, path)
}

// staleSocket leaves at path a socket nobody listens on, as a daemon
// that was killed does.
func staleSocket(t *testing.T, path string) {
	t.Helper()
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	l.SetUnlinkOnClose(false)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := net.Dial("unix", path); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("the stale socket: dial %v, want connection refused", err)
	}
}

func TestStaleSocketReplaced(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.sock")
	staleSocket(t, path)
	l, err := Listen(path)
	if err != nil {
		t.Fatalf("listen over a stale socket: %v", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- (&Server[request, reply]{Handle: handle}).Serve(ctx, l) }()
	mustServe(t, path)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

// A socket a live daemon answers on is not taken over, whether that
// daemon took the lock (ours) or not (anyone else's listener).
func TestLiveSocketNotStolen(t *testing.T) {
	path, _, _ := serve(t, &Server[request, reply]{Handle: handle})
	ino := inode(t, path)
	if l, err := Listen(path); err == nil || !strings.Contains(err.Error(), "another daemon holds "+path+".lock") {
		if l != nil {
			l.Close()
		}
		t.Fatalf("second Listen on a live socket: %v", err)
	}
	if inode(t, path) != ino {
		t.Fatal("the live socket was replaced")
	}
	mustServe(t, path)

	other := filepath.Join(t.TempDir(), "other.sock")
	ol, err := net.Listen("unix", other)
	if err != nil {
		t.Fatal(err)
	}
	defer ol.Close()
	ino = inode(t, other)
	if l, err := Listen(other); err == nil || !strings.Contains(err.Error(), "a daemon is already answering on it") {
		if l != nil {
			l.Close()
		}
		t.Fatalf("Listen on another program's live socket: %v", err)
	}
	if inode(t, other) != ino {
		t.Fatal("the other program's socket was replaced")
	}
	if _, err := os.Stat(other + ".lock"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused Listen left its lock file: %v", err)
	}
}

// A file that is not a socket is never removed to make room.
func TestNonSocketFileNotReplaced(t *testing.T) {
	path := filepath.Join(t.TempDir(), "precious")
	if err := os.WriteFile(path, []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	if l, err := Listen(path); err == nil || !strings.Contains(err.Error(), "a regular file is there, not a socket") {
		if l != nil {
			l.Close()
		}
		t.Fatalf("Listen on a regular file: %v", err)
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "keep me" {
		t.Fatalf("the file after a refused Listen: %q, %v", b, err)
	}
}

// Cancelling stops the server and removes its own socket and lock; a
// socket someone else has put at the path since is left alone.
func TestCancelStopsTheServerAndRemovesOnlyWhatItOwns(t *testing.T) {
	path, cancel, done := serve(t, &Server[request, reply]{Handle: handle})
	mustServe(t, path)
	cancel()
	select {
	case err := <-done:
		done <- err // for the cleanup
	case <-time.After(5 * time.Second):
		t.Fatal("Serve still running 5 s after its context ended")
	}
	for _, p := range []string{path, path + ".lock"} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s after the server ended: %v, want it removed", p, err)
		}
	}

	path2, cancel2, done2 := serve(t, &Server[request, reply]{Handle: handle})
	// Someone removes the socket and binds their own at the path.
	if err := os.Remove(path2); err != nil {
		t.Fatal(err)
	}
	theirs, err := net.Listen("unix", path2)
	if err != nil {
		t.Fatal(err)
	}
	defer theirs.Close()
	cancel2()
	err = <-done2
	done2 <- err
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("unix", path2)
	if err != nil {
		t.Fatalf("the other socket at %s after our server ended: %v, want it still there", path2, err)
	}
	c.Close()
}

// After runs once the reply is out: a request that stops the daemon still
// gets its answer.
func TestAfterRunsOnceTheReplyIsOut(t *testing.T) {
	got := make(chan struct{})
	var cancel context.CancelFunc
	outFirst := make(chan bool, 1)
	s := &Server[request, reply]{Handle: handle, After: func(r request, _ reply, err error) {
		if r.Op != "echo" || err != nil {
			return
		}
		select { // the client has the reply before After does anything
		case <-got:
			outFirst <- true
		case <-time.After(2 * time.Second):
			outFirst <- false
		}
		cancel()
	}}
	path, c, done := serve(t, s)
	cancel = c
	if r, err := ask(path, request{Op: "echo", N: 1}); err != nil || r.Echo != "x" {
		t.Fatalf("the stopping request's reply: %+v, %v", r, err)
	}
	close(got)
	if !<-outFirst {
		t.Error("After ran before the client had the reply")
	}
	select {
	case err := <-done:
		done <- err
	case <-time.After(5 * time.Second):
		t.Fatal("After did not stop the server")
	}
}

func TestSocketIsMode0600WhateverTheUmask(t *testing.T) {
	old := syscall.Umask(0)
	defer syscall.Umask(old)
	path := filepath.Join(t.TempDir(), "c.sock")
	l, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, p := range []string{path, path + ".lock"} {
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", p, fi.Mode())
		}
	}
}

func TestAskWithoutADaemonIsADialError(t *testing.T) {
	_, err := ask(filepath.Join(t.TempDir(), "none.sock"), request{Op: "echo"})
	var de *DialError
	if !errors.As(err, &de) || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Ask with no socket: %v (%T), want a DialError", err, err)
	}
}

// The default socket is named by this namespace's inode, as the kernel
// shows it in the /proc/self/ns/net link.
func TestDefaultPathIsNamedByTheNetworkNamespace(t *testing.T) {
	link, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	var ino uint64
	if _, err := fmt.Sscanf(link, "net:[%d]", &ino); err != nil {
		t.Fatalf("%q: %v", link, err)
	}
	p, err := DefaultPath("/run/x")
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("/run/x/netns-%d.sock", ino); p != want {
		t.Fatalf("DefaultPath = %s, want %s", p, want)
	}
}

// Daemons started at once over a stale socket: one takes the path, the
// others are refused, and the socket there is the winner's.
func TestDaemonsStartingAtOnceOneWins(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.sock")
	staleSocket(t, path)
	const n = 8
	type res struct {
		l   *Listener
		err error
	}
	out := make(chan res, n)
	start := make(chan struct{})
	for range n {
		go func() {
			<-start
			l, err := Listen(path)
			out <- res{l, err}
		}()
	}
	close(start)
	var won []*Listener
	for range n {
		r := <-out
		if r.err == nil {
			won = append(won, r.l)
			defer r.l.Close()
		} else if !strings.Contains(r.err.Error(), "another daemon holds") && !strings.Contains(r.err.Error(), "already answering") {
			t.Errorf("a loser's error: %v", r.err)
		}
	}
	if len(won) != 1 {
		t.Fatalf("%d of %d daemons took %s, want 1", len(won), n, path)
	}
	if inode(t, path) != won[0].ino {
		t.Fatal("the socket at the path is not the winner's")
	}
}

// flakyListener fails its first n Accepts with err.
type flakyListener struct {
	net.Listener
	n   int
	err error
}

func (f *flakyListener) Accept() (net.Conn, error) {
	if f.n > 0 {
		f.n--
		return nil, &net.OpError{Op: "accept", Net: "unix", Err: f.err}
	}
	return f.Listener.Accept()
}

// Running out of descriptors for a moment does not end the control
// socket; an error that will not pass does, and Serve says which.
func TestServeOutlastsAShortageOfDescriptors(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.sock")
	l, err := Listen(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- (&Server[request, reply]{Handle: handle}).Serve(ctx, &flakyListener{Listener: l, n: 3, err: syscall.EMFILE})
	}()
	mustServe(t, path)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	path = filepath.Join(t.TempDir(), "c.sock")
	if l, err = Listen(path); err != nil {
		t.Fatal(err)
	}
	err = (&Server[request, reply]{Handle: handle}).Serve(t.Context(), &flakyListener{Listener: l, n: 1, err: syscall.EINVAL})
	if !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("Serve after a lasting accept error: %v, want it returned", err)
	}
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the socket after Serve gave up: %v, want it removed", err)
	}
}
