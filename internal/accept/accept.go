// Package accept keeps a daemon's listener serving through a flood: every
// listener in onehop (the VNAT daemon's VCMP port, the location server,
// the location relay, the control sockets, the gateway's intercept
// listener, the REST API and the metrics ports) accepts through a Listener.
//
// A Listener wraps a net.Listener and
//
//   - backs off on an accept error that passes by itself (EMFILE, ENFILE,
//     ENOBUFS, ENOMEM, ECONNABORTED: out of descriptors or memory) and
//     accepts again, where a plain accept loop would return and leave the
//     process alive and deaf (issue 20: two bursts of ~11,000 idle
//     connections stopped a VNAT daemon for good);
//   - caps the connections one source address holds at once and those of
//     all sources together: one over a cap is closed at once, so one
//     source cannot take every slot from the others;
//   - closes a connection on which nothing moved either way for Idle, so
//     connections held open and silent give their slots back;
//   - counts all of that by reason (Stats, a prometheus.Collector) and logs
//     it rate-limited (internal/ratelog): the flood's sources choose how
//     often it happens.
package accept

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/onehop/onehop/internal/backoff"
	"github.com/onehop/onehop/internal/ratelog"
)

// DefaultBackoff is the pause after a temporary accept error: from 5 ms,
// doubling up to 1 s (net/http's schedule), reset by the next accept that
// succeeds.
var DefaultBackoff = backoff.Backoff{Initial: 5 * time.Millisecond, Max: time.Second}

// Limits bound one listener. A zero field is no bound (Backoff: the
// default schedule).
type Limits struct {
	// PerSource caps the connections one source address holds at once
	// (all connections of a unix socket are one source).
	PerSource int
	// Total caps the connections held at once.
	Total int
	// Idle closes a connection when a read or write has waited this long
	// with no byte moved either way.
	Idle time.Duration
	// Backoff is the pause schedule after temporary accept errors;
	// its Tries and For are ignored (a listener never gives up).
	Backoff backoff.Backoff
}

// Or fills l's zero fields from d.
func (l Limits) Or(d Limits) Limits {
	if l.PerSource == 0 {
		l.PerSource = d.PerSource
	}
	if l.Total == 0 {
		l.Total = d.Total
	}
	if l.Idle == 0 {
		l.Idle = d.Idle
	}
	l.Backoff = l.Backoff.Or(d.Backoff)
	return l
}

// Validate says which limit is negative, under the names the daemon's
// flags give them (e.g. "--max-conns-per-source"). A zero limit is one the
// caller fills with Or from its defaults.
func (l Limits) Validate(perSource, total, idle string) error {
	var errs []error
	if l.PerSource < 0 {
		errs = append(errs, fmt.Errorf("%s %d: want a positive number of connections", perSource, l.PerSource))
	}
	if l.Total < 0 {
		errs = append(errs, fmt.Errorf("%s %d: want a positive number of connections", total, l.Total))
	}
	if l.Idle < 0 {
		errs = append(errs, fmt.Errorf("%s %s: want a positive duration, e.g. 10s", idle, l.Idle))
	}
	return errors.Join(errs...)
}

// Options name and bound a Listener.
type Options struct {
	// Name is the listener's label in metrics and logs ("vcmp", "api").
	Name string
	Limits
	// Log takes the refusals, at most one line a second per reason and
	// source; nil: slog.Default().
	Log *slog.Logger
	// Stats collects the counts; several listeners may share one (those
	// of one name add up). Nil: the listener's own.
	Stats *Stats
}

// Listener is a net.Listener that survives floods: see the package comment.
type Listener struct {
	inner net.Listener
	name  string
	lim   Limits
	rlog  *ratelog.Logger
	stats *Stats

	closeOnce sync.Once
	done      chan struct{}

	mu        sync.Mutex
	perSource map[netip.Addr]int
	total     int
}

// Wrap makes l survive floods, as o says.
func Wrap(l net.Listener, o Options) *Listener {
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Stats == nil {
		o.Stats = NewStats(nil)
	}
	o.Limits.Backoff = o.Limits.Backoff.Or(DefaultBackoff)
	o.Limits.Backoff.Tries, o.Limits.Backoff.For = 0, 0
	o.Stats.declare(o.Name)
	return &Listener{inner: l, name: o.Name, lim: o.Limits, rlog: ratelog.New(o.Log, 1, time.Second, nil),
		stats: o.Stats, done: make(chan struct{}), perSource: map[netip.Addr]int{}}
}

// Accept waits for the next connection within the caps. A temporary error
// is counted, logged and waited out; a connection over a cap is closed,
// counted and logged; neither returns. It returns the wrapped listener's
// other errors (net.ErrClosed once closed).
func (l *Listener) Accept() (net.Conn, error) {
	var retry *backoff.Retry
	for {
		c, err := l.inner.Accept()
		if err != nil {
			errno, ok := Temporary(err)
			if !ok || l.isClosed() {
				return nil, err
			}
			l.stats.add(l.name, AcceptErrors, errno, 1)
			l.rlog.Warn("accept:"+errno, "accept failed for want of descriptors or memory; waiting, then accepting again",
				"listener", l.name, "addr", l.inner.Addr().String(), "err", err)
			if retry == nil {
				retry = l.lim.Backoff.Start(time.Now())
			}
			pause, _ := retry.Next(time.Now())
			t := time.NewTimer(pause)
			select {
			case <-l.done:
				t.Stop()
				return nil, net.ErrClosed
			case <-t.C:
			}
			continue
		}
		retry = nil
		src := Source(c.RemoteAddr())
		if reason, held := l.admit(src); reason != "" {
			c.Close() //nolint:errcheck // refused: nothing was sent on it
			l.stats.add(l.name, Refused, reason, 1)
			who := "local"
			if src.IsValid() {
				who = src.String()
			}
			l.rlog.Warn(reason+":"+who, "connection refused over a cap; closed at once",
				"listener", l.name, "reason", reason, "source", who, "held", held, "per_source", l.lim.PerSource, "total", l.lim.Total)
			continue
		}
		l.stats.add(l.name, Accepted, "", 1)
		l.stats.open(l.name, 1)
		return &Conn{Conn: c, l: l, src: src}, nil
	}
}

// admit takes a slot for src, or says which cap is full ("per_source",
// "total") and how many connections hold it.
func (l *Listener) admit(src netip.Addr) (string, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lim.PerSource > 0 && l.perSource[src] >= l.lim.PerSource {
		return ReasonPerSource, l.perSource[src]
	}
	if l.lim.Total > 0 && l.total >= l.lim.Total {
		return ReasonTotal, l.total
	}
	l.perSource[src]++
	l.total++
	return "", 0
}

func (l *Listener) release(src netip.Addr) {
	l.mu.Lock()
	if l.perSource[src]--; l.perSource[src] <= 0 {
		delete(l.perSource, src)
	}
	l.total--
	l.mu.Unlock()
	l.stats.open(l.name, -1)
}

// Close closes the wrapped listener and ends an Accept waiting out an
// error. Connections accepted stay open.
func (l *Listener) Close() error {
	err := net.ErrClosed
	l.closeOnce.Do(func() {
		close(l.done)
		err = l.inner.Close()
	})
	return err
}

func (l *Listener) isClosed() bool {
	select {
	case <-l.done:
		return true
	default:
		return false
	}
}

// Addr is the wrapped listener's address.
func (l *Listener) Addr() net.Addr { return l.inner.Addr() }

// Open is how many accepted connections are not closed yet.
func (l *Listener) Open() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total
}

// Counters are the counts of the listener's name (see Stats.Counters).
func (l *Listener) Counters() map[string]uint64 { return l.stats.Counters(l.name) }

// Source is the address a connection comes from (IPv4-mapped unmapped);
// the invalid Addr for a unix socket, whose connections are one source.
func Source(a net.Addr) netip.Addr {
	switch a := a.(type) {
	case *net.TCPAddr:
		return a.AddrPort().Addr().Unmap()
	case *net.UDPAddr:
		return a.AddrPort().Addr().Unmap()
	}
	if a == nil {
		return netip.Addr{}
	}
	if ap, err := netip.ParseAddrPort(a.String()); err == nil {
		return ap.Addr().Unmap()
	}
	return netip.Addr{}
}

// temporary are the accept errors that pass by themselves, by the name
// they are counted under.
var temporary = []struct {
	errno syscall.Errno
	name  string
}{
	{syscall.EMFILE, "emfile"}, {syscall.ENFILE, "enfile"}, {syscall.ENOBUFS, "enobufs"},
	{syscall.ENOMEM, "enomem"}, {syscall.ECONNABORTED, "econnaborted"},
}

// Temporary says whether an accept error passes by itself (a process or
// the system out of descriptors or memory, a connection reset before it
// was taken) and names it as it is counted ("emfile"). Timeouts are not:
// a listener with a deadline set wants them back.
func Temporary(err error) (string, bool) {
	for _, t := range temporary {
		if errors.Is(err, t.errno) {
			return t.name, true
		}
	}
	return "", false
}

// Conn is an accepted connection: closing it gives its slot back, and with
// Limits.Idle its reads and writes end (os.ErrDeadlineExceeded) once
// nothing has moved either way for Idle.
type Conn struct {
	net.Conn
	l    *Listener
	src  netip.Addr
	once sync.Once

	mu sync.Mutex
	// progress is when a byte last moved either way.
	progress time.Time
	// userRead, userWrite are the deadlines the caller set; armedRead,
	// armedWrite the idle deadlines of the read and write under way.
	userRead, userWrite, armedRead, armedWrite time.Time
	idled                                      bool
}

// Close closes the connection and gives its slot back (once).
func (c *Conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c.src) })
	return err
}

// Source is the address the connection comes from (see Source).
func (c *Conn) Source() netip.Addr { return c.src }

// NetConn is the accepted connection itself, for what needs its type
// (splice between two *net.TCPConn): it has no idle deadline. Close the
// Conn, not it, to give the slot back.
func (c *Conn) NetConn() net.Conn { return c.Conn }

// Read reads, ending with os.ErrDeadlineExceeded after Idle with nothing
// moved either way (or at the caller's deadline).
func (c *Conn) Read(b []byte) (int, error) {
	if c.l.lim.Idle <= 0 {
		return c.Conn.Read(b)
	}
	return c.io(b, c.Conn.Read, &c.userRead, &c.armedRead, c.Conn.SetReadDeadline)
}

// Write writes, ending like Read: a peer that stops reading holds a slot
// no longer than one that stops sending.
func (c *Conn) Write(b []byte) (int, error) {
	if c.l.lim.Idle <= 0 {
		return c.Conn.Write(b)
	}
	return c.io(b, c.Conn.Write, &c.userWrite, &c.armedWrite, c.Conn.SetWriteDeadline)
}

// io runs one read or write under an idle deadline. The deadline counts
// from the later of the call's start and the last byte moved either way,
// so a read waiting while the other direction streams (a relay's one-way
// transfer) is not idle; when it fires with bytes moved meanwhile it is
// set again. The caller's own deadline, if earlier, wins and is returned
// as it is.
func (c *Conn) io(b []byte, op func([]byte) (int, error), user, armed *time.Time, set func(time.Time) error) (int, error) {
	start := time.Now()
	idle := c.l.lim.Idle
	for {
		c.mu.Lock()
		at := start
		if c.progress.After(at) {
			at = c.progress
		}
		*armed = at.Add(idle)
		d := earliest(*user, *armed)
		c.mu.Unlock()
		if err := set(d); err != nil {
			return 0, err
		}
		n, err := op(b)
		now := time.Now()
		c.mu.Lock()
		*armed = time.Time{}
		if n > 0 {
			c.progress = now
		}
		u, p := *user, c.progress
		if n > 0 || !errors.Is(err, os.ErrDeadlineExceeded) || !u.IsZero() && !now.Before(u) {
			c.mu.Unlock()
			return n, err
		}
		if p.Add(idle).After(now) || start.Add(idle).After(now) {
			c.mu.Unlock()
			continue // moved the other way meanwhile, or a deadline changed under us
		}
		first := !c.idled
		c.idled = true
		c.mu.Unlock()
		if first {
			c.l.stats.add(c.l.name, IdleClosed, "", 1)
		}
		return n, err
	}
}

// earliest is the earlier of two deadlines, the zero time being none.
func earliest(a, b time.Time) time.Time {
	switch {
	case a.IsZero():
		return b
	case b.IsZero() || a.Before(b):
		return a
	}
	return b
}

// SetDeadline sets the caller's read and write deadlines (the idle
// deadline still applies when it is earlier).
func (c *Conn) SetDeadline(t time.Time) error {
	if err := c.SetReadDeadline(t); err != nil {
		return err
	}
	return c.SetWriteDeadline(t)
}

// SetReadDeadline sets the caller's read deadline; it applies at once to a
// read under way (net/http ends its background read with a deadline in
// the past).
func (c *Conn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	c.userRead = t
	d := earliest(t, c.armedRead)
	c.mu.Unlock()
	return c.Conn.SetReadDeadline(d)
}

// SetWriteDeadline sets the caller's write deadline, as SetReadDeadline.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	c.userWrite = t
	d := earliest(t, c.armedWrite)
	c.mu.Unlock()
	return c.Conn.SetWriteDeadline(d)
}
