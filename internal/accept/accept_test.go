package accept

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/accept/accepttest"
	"github.com/onehop/onehop/internal/backoff"
	"github.com/onehop/onehop/internal/testenv"
)

// fakeListener returns its errors in turn, then conns from its channel.
type fakeListener struct {
	mu    sync.Mutex
	errs  []error
	conns chan net.Conn
}

func (f *fakeListener) Accept() (net.Conn, error) {
	f.mu.Lock()
	if len(f.errs) > 0 {
		err := f.errs[0]
		f.errs = f.errs[1:]
		f.mu.Unlock()
		return nil, err
	}
	f.mu.Unlock()
	c, ok := <-f.conns
	if !ok {
		return nil, net.ErrClosed
	}
	return c, nil
}
func (f *fakeListener) Close() error   { return nil }
func (f *fakeListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 2031} }

// fakeConn is a connection from a given source.
type fakeConn struct {
	net.Conn
	from netip.AddrPort
}

func (c fakeConn) RemoteAddr() net.Addr { return net.TCPAddrFromAddrPort(c.from) }

var quick = backoff.Backoff{Initial: time.Millisecond, Max: time.Millisecond}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

// TestTemporaryAcceptErrorsAreWaitedOutAndAcceptingGoesOn: every error of
// a process or system out of descriptors or memory is counted under its
// errno and accepting goes on; the connection behind them is handed out.
func TestTemporaryAcceptErrorsAreWaitedOutAndAcceptingGoesOn(t *testing.T) {
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	f := &fakeListener{conns: make(chan net.Conn, 1)}
	for _, e := range []syscall.Errno{syscall.EMFILE, syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM, syscall.ECONNABORTED} {
		f.errs = append(f.errs, &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", e)})
	}
	f.conns <- fakeConn{Conn: a, from: netip.MustParseAddrPort("192.0.2.1:4000")}
	l := Wrap(f, Options{Name: "t", Limits: Limits{Backoff: quick}, Log: quiet()})
	c, err := l.Accept()
	if err != nil {
		t.Fatalf("accept through six temporary errors: %v", err)
	}
	if got := c.(*Conn).Source(); got != netip.MustParseAddr("192.0.2.1") {
		t.Fatalf("source %v, want 192.0.2.1", got)
	}
	want := map[string]uint64{"accept_emfile": 2, "accept_enfile": 1, "accept_enobufs": 1, "accept_enomem": 1, "accept_econnaborted": 1, "accepted": 1, "open": 1}
	got := l.Counters()
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %d, want %d (all: %v)", k, got[k], v, got)
		}
	}
	c.Close()
	c.Close() // a second close gives nothing back twice
	if got := l.Counters()["open"]; got != 0 {
		t.Fatalf("open after close = %d, want 0", got)
	}
}

// TestAnAcceptErrorThatStaysIsReturned: a closed listener, or an error no
// wait mends, ends Accept with it.
func TestAnAcceptErrorThatStaysIsReturned(t *testing.T) {
	bad := errors.New("listener broken")
	l := Wrap(&fakeListener{errs: []error{bad}}, Options{Name: "t", Log: quiet()})
	if _, err := l.Accept(); !errors.Is(err, bad) {
		t.Fatalf("accept: %v, want %v", err, bad)
	}
}

// TestCloseEndsAnAcceptWaitingOutAnError: a daemon that stops while its
// listener waits out EMFILE is not held for the rest of the pause.
func TestCloseEndsAnAcceptWaitingOutAnError(t *testing.T) {
	f := &fakeListener{errs: []error{syscall.EMFILE}}
	l := Wrap(f, Options{Name: "t", Limits: Limits{Backoff: backoff.Backoff{Initial: time.Hour}}, Log: quiet()})
	done := make(chan error, 1)
	go func() { _, err := l.Accept(); done <- err }()
	testenv.Eventually(t, "the EMFILE counted", 10*time.Second, func() bool { return l.Counters()["accept_emfile"] == 1 })
	l.Close()
	if err := <-done; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("accept after close: %v, want net.ErrClosed", err)
	}
}

// serve accepts on l until it closes, handing each connection to conns.
func serve(t *testing.T, l *Listener) <-chan net.Conn {
	conns := make(chan net.Conn, 64)
	go func() {
		defer close(conns)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns <- c
		}
	}()
	t.Cleanup(func() {
		l.Close()
		for c := range conns {
			c.Close()
		}
	})
	return conns
}

func listen(t *testing.T, o Options) *Listener {
	t.Helper()
	nl, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if o.Log == nil {
		o.Log = quiet()
	}
	return Wrap(nl, o)
}

// closedByServer: the server closed c without a byte.
func closedByServer(t *testing.T, c net.Conn) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read on a refused connection: %d bytes, %v; want end of stream", n, err)
	}
}

// TestOneSourceAtItsCapLeavesOthersServed: a source's connections over
// PerSource are closed at once and counted; another source is still
// served, and a slot given back is taken again.
func TestOneSourceAtItsCapLeavesOthersServed(t *testing.T) {
	l := listen(t, Options{Name: "t", Limits: Limits{PerSource: 3, Total: 10}})
	conns := serve(t, l)
	var held []net.Conn
	for range 3 {
		accepttest.DialFrom(t, l.Addr(), "127.0.0.1")
		held = append(held, <-conns)
	}
	over := accepttest.DialFrom(t, l.Addr(), "127.0.0.1")
	closedByServer(t, over)
	if got := l.Counters()["refused_per_source"]; got != 1 {
		t.Fatalf("refused_per_source %d, want 1", got)
	}
	other := accepttest.DialFrom(t, l.Addr(), "127.0.0.2")
	srv := <-conns
	if got := srv.(*Conn).Source(); got != netip.MustParseAddr("127.0.0.2") {
		t.Fatalf("served %v, want 127.0.0.2", got)
	}
	if _, err := srv.Write([]byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(other, make([]byte, 1)); err != nil {
		t.Fatalf("the other source's connection: %v", err)
	}
	held[0].Close()
	accepttest.DialFrom(t, l.Addr(), "127.0.0.1")
	if got := (<-conns).(*Conn).Source(); got != netip.MustParseAddr("127.0.0.1") {
		t.Fatalf("after a slot came back, served %v, want 127.0.0.1", got)
	}
}

// TestConnectionsOverTheTotalAreRefused: Total holds across sources.
func TestConnectionsOverTheTotalAreRefused(t *testing.T) {
	l := listen(t, Options{Name: "t", Limits: Limits{PerSource: 5, Total: 2}})
	conns := serve(t, l)
	accepttest.DialFrom(t, l.Addr(), "127.0.0.1")
	<-conns
	accepttest.DialFrom(t, l.Addr(), "127.0.0.2")
	<-conns
	closedByServer(t, accepttest.DialFrom(t, l.Addr(), "127.0.0.3"))
	if c := l.Counters(); c["refused_total"] != 1 || c["refused_per_source"] != 0 || c["open"] != 2 {
		t.Fatalf("counters %v, want refused_total 1, open 2", c)
	}
}

// TestAnIdleConnectionEndsAndIsCounted: a read with nothing coming ends
// after Idle; the caller's own later deadline does not keep it.
func TestAnIdleConnectionEndsAndIsCounted(t *testing.T) {
	l := listen(t, Options{Name: "t", Limits: Limits{Idle: 50 * time.Millisecond}})
	conns := serve(t, l)
	cl := accepttest.DialFrom(t, l.Addr(), "127.0.0.1")
	srv := <-conns
	srv.SetDeadline(time.Now().Add(time.Hour))
	// control: a byte sent is read
	if _, err := cl.Write([]byte("a")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(srv, make([]byte, 1)); err != nil {
		t.Fatalf("control read: %v", err)
	}
	_, err := srv.Read(make([]byte, 1))
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("idle read: %v, want a deadline error", err)
	}
	if got := l.Counters()["idle_closed"]; got != 1 {
		t.Fatalf("idle_closed %d, want 1", got)
	}
}

// TestTheCallersEarlierDeadlineWins: a deadline the server set before the
// idle one is returned as it is, not counted as idleness.
func TestTheCallersEarlierDeadlineWins(t *testing.T) {
	l := listen(t, Options{Name: "t", Limits: Limits{Idle: time.Hour}})
	conns := serve(t, l)
	accepttest.DialFrom(t, l.Addr(), "127.0.0.1")
	srv := <-conns
	srv.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	if _, err := srv.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read: %v, want the caller's deadline", err)
	}
	if got := l.Counters()["idle_closed"]; got != 0 {
		t.Fatalf("idle_closed %d, want 0", got)
	}
}

// TestAReadWaitingWhileTheOtherDirectionMovesIsNotIdle: a relay's read
// side waits while its write side streams; the connection is busy.
func TestAReadWaitingWhileTheOtherDirectionMovesIsNotIdle(t *testing.T) {
	idle := time.Second
	l := listen(t, Options{Name: "t", Limits: Limits{Idle: idle}})
	conns := serve(t, l)
	cl := accepttest.DialFrom(t, l.Addr(), "127.0.0.1")
	srv := <-conns
	go io.Copy(io.Discard, cl)
	stop := make(chan struct{})
	wrote := make(chan error, 1)
	go func() {
		for {
			select {
			case <-stop:
				wrote <- nil
				return
			case <-time.After(10 * time.Millisecond):
			}
			if _, err := srv.Write([]byte("x")); err != nil {
				wrote <- err
				return
			}
		}
	}()
	read := make(chan error, 1)
	go func() { _, err := srv.Read(make([]byte, 1)); read <- err }()
	// Three idle periods of writing, then a byte the read must get.
	time.Sleep(3 * idle)
	if _, err := cl.Write([]byte("y")); err != nil {
		t.Fatal(err)
	}
	if err := <-read; err != nil {
		t.Fatalf("read while writes moved: %v, want the byte", err)
	}
	close(stop)
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
	if got := l.Counters()["idle_closed"]; got != 0 {
		t.Fatalf("idle_closed %d, want 0", got)
	}
}

// TestARealDescriptorFloodIsWaitedOut: with RLIMIT_NOFILE low (in a child
// process), a flood of idle connections makes accept fail with EMFILE;
// once the flood goes away the listener serves again.
func TestARealDescriptorFloodIsWaitedOut(t *testing.T) {
	if accepttest.IsChild() {
		accepttest.ServeChild(func(nl net.Listener) {
			l := Wrap(nl, Options{Name: "flood", Limits: Limits{Backoff: backoff.Backoff{Initial: 5 * time.Millisecond, Max: 50 * time.Millisecond}}})
			for {
				c, err := l.Accept()
				if err != nil {
					accepttest.ChildFail(fmt.Errorf("accept: %w", err))
				}
				go func() {
					defer c.Close()
					io.Copy(c, c) // echo until the client goes
				}()
			}
		})
	}
	accepttest.FloodAndRecover(t, "TestARealDescriptorFloodIsWaitedOut", func(c net.Conn) error {
		if _, err := c.Write([]byte("ping")); err != nil {
			return err
		}
		b := make([]byte, 4)
		_, err := io.ReadFull(c, b)
		if err == nil && string(b) != "ping" {
			err = fmt.Errorf("echo %q, want ping", b)
		}
		return err
	})
}
