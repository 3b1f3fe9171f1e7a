package vnatd

import (
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/netns/netnstest"
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
	go echoBytes(netnstest.Listen(t, p.nsB, "10.8.0.2:5002"))
	type client struct {
		c        net.Conn
		written  atomic.Int64
		echoed   atomic.Int64
		mu       sync.Mutex
		err      error
		readDone chan struct{}
	}
	cs := make([]*client, conns)
	for i, c := range p.dialMany(t, conns, "10.8.0.2:5002", 5*time.Second) {
		cs[i] = &client{c: c, readDone: make(chan struct{})}
	}
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
	p.waitConns(t, "a keyed", p.a.sock, "active", "5002", conns, 60*time.Second)
	p.waitConns(t, "b keyed", p.b.sock, "active", "5002", conns, 60*time.Second)

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
	p.moveBRoutesFirst(t)
	p.waitConns(t, "b migrated", p.b.sock, "migrated", "5002", conns, 60*time.Second)
	p.waitConns(t, "a migrated", p.a.sock, "migrated", "5002", conns, 60*time.Second)
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
	for _, line := range strings.Split(p.b.logs.String(), "\n") {
		if strings.Contains(line, `msg="vnat: restored"`) {
			t.Log(line)
		}
	}
	if writeErrs.Load() > 0 || len(lost) > 0 || reset > 0 {
		e, _ := firstErr.Load().(string)
		t.Fatalf("%d of %d connections did not survive the restore (%d reset, %d write errors, first %q)", len(lost), conns, reset, writeErrs.Load(), e)
	}
}
