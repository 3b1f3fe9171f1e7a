package vnatd

import (
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/netns"
)

// The restore race, with real daemons: 2,000 TCP connections whose
// stationary end (a) writes to them without pause while the other end (b)
// is re-addressed and restores them. The peer translates each connection as
// soon as it accepts its update and its next segment goes to b's new
// address at once; before b translated its own end first, the segments
// sent in between found no socket with that tuple there and b's kernel
// answered with a RESET (a 10,000-connection restore with Go's default
// keepalives kept 8,753). Every connection must carry on, none reset.
func TestPrivilegedRestoreLosesNoConnectionToAPeerSendingDuringIt(t *testing.T) {
	const conns = 2000
	p := newPair(t, nil, nil)
	nsA, nsB, sockA, sockB, logA, logB := p.nsA, p.nsB, p.a.sock, p.b.sock, p.a.logs, p.b.logs
	var ln net.Listener
	if err := netns.Do(nsB, func() (err error) {
		ln, err = net.Listen("tcp4", "10.8.0.2:5002")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { // echo
				defer c.Close()
				buf := make([]byte, 4096)
				for {
					k, err := c.Read(buf)
					if err != nil {
						return
					}
					if _, err := c.Write(buf[:k]); err != nil {
						return
					}
				}
			}()
		}
	}()
	type client struct {
		c        net.Conn
		written  atomic.Int64
		echoed   atomic.Int64
		mu       sync.Mutex
		err      error
		readDone chan struct{}
	}
	cs := make([]*client, conns)
	if err := netns.Do(nsA, func() error {
		for i := range cs {
			c, err := net.DialTimeout("tcp4", "10.8.0.2:5002", 5*time.Second)
			if err != nil {
				return err
			}
			cs[i] = &client{c: c, readDone: make(chan struct{})}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range cs {
			c.c.Close()
		}
	}()
	for _, c := range cs {
		go func() {
			defer close(c.readDone)
			buf := make([]byte, 4096)
			for {
				k, err := c.c.Read(buf)
				c.echoed.Add(int64(k))
				if err != nil {
					c.mu.Lock()
					c.err = err
					c.mu.Unlock()
					return
				}
			}
		}()
	}
	write := func(c *client) error {
		if err := c.c.SetWriteDeadline(time.Now().Add(10 * time.Second)); err != nil {
			return err
		}
		k, err := c.c.Write([]byte{'x'})
		c.written.Add(int64(k))
		return err
	}
	count := func(sock, state string) int {
		r, err := Ask(sock, Request{Op: "status"})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, c := range r.Conns {
			// The echo server's connections (port 5002 at either end).
			if c.State == state && c.Keyed && strings.Contains(c.Virtual, ":5002") {
				n++
			}
		}
		return n
	}
	waitCount := func(what, sock, state string, timeout time.Duration) {
		t.Helper()
		deadline := time.Now().Add(timeout)
		for count(sock, state) < conns {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d of %d connections %s and keyed\n%s\n---\n%s", what, count(sock, state), conns, state, logA, logB)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	waitCount("a keyed", sockA, "active", 60*time.Second)
	waitCount("b keyed", sockB, "active", 60*time.Second)

	// a writes to every connection, round after round, until b restored.
	stop := make(chan struct{})
	var writeErrs atomic.Int64
	var firstErr atomic.Value
	wdone := make(chan struct{})
	rounds := 0
	go func() {
		defer close(wdone)
		for {
			for _, c := range cs {
				select {
				case <-stop:
					return
				default:
				}
				if c.err != nil {
					continue
				}
				if err := write(c); err != nil {
					writeErrs.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
				}
			}
			rounds++
		}
	}()
	ipIn(t, nsB, "route", "add", "10.8.0.1/32", "dev", "b0")
	ipIn(t, nsA, "route", "add", "10.8.1.0/24", "dev", "a0")
	ipIn(t, nsB, "addr", "del", "10.8.0.2/24", "dev", "b0")
	ipIn(t, nsB, "addr", "add", "10.8.1.3/24", "dev", "b0")
	ipIn(t, nsB, "route", "replace", "10.8.0.0/24", "dev", "b0")
	ipIn(t, nsA, "neigh", "flush", "dev", "a0")
	waitCount("b migrated", sockB, "migrated", 60*time.Second)
	waitCount("a migrated", sockA, "migrated", 60*time.Second)
	// Half a second more of writes at the new place, then stop.
	time.Sleep(500 * time.Millisecond)
	close(stop)
	<-wdone
	if rounds < 1 {
		t.Fatalf("a wrote %d full rounds during the restore, want at least one", rounds)
	}
	// One more byte on every connection, then every byte written must
	// come back: a connection reset loses its echoes and its reader ends.
	for _, c := range cs {
		if err := write(c); err != nil {
			writeErrs.Add(1)
			firstErr.CompareAndSwap(nil, err.Error())
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	var lost []int
	for i, c := range cs {
		for c.echoed.Load() < c.written.Load() && time.Now().Before(deadline) {
			select {
			case <-c.readDone:
			case <-time.After(20 * time.Millisecond):
				continue
			}
			break
		}
		if c.echoed.Load() != c.written.Load() {
			lost = append(lost, i)
		}
	}
	reset := 0
	for _, c := range cs {
		c.mu.Lock()
		if c.err != nil && (errors.Is(c.err, net.ErrClosed) || strings.Contains(c.err.Error(), "reset")) {
			reset++
		}
		c.mu.Unlock()
	}
	t.Logf("a wrote %d rounds over %d connections during the restore; %d write errors, %d connections reset, %d lost echoes", rounds, conns, writeErrs.Load(), reset, len(lost))
	for _, line := range strings.Split(logB.String(), "\n") {
		if strings.Contains(line, `msg="vnat: restored"`) {
			t.Log(line)
		}
	}
	if writeErrs.Load() > 0 || len(lost) > 0 || reset > 0 {
		e, _ := firstErr.Load().(string)
		t.Fatalf("%d of %d connections did not survive the restore (%d reset, %d write errors, first %q)", len(lost), conns, reset, writeErrs.Load(), e)
	}
}
