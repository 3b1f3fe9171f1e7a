package vnatd

import (
	"errors"
	"fmt"
	"slices"
	"syscall"

	"github.com/onehop/onehop/internal/vcmp"
)

// Conflict is a connection's policy for a virtual-identification conflict
// (paper §3.4.2): its migration would give it a 4-tuple another live
// connection at the target end already uses (an address and port reused
// by a new host or process while the old connection lives on elsewhere).
type Conflict string

const (
	// ConflictDefault is "the daemon's default" (a connection's zero value).
	ConflictDefault Conflict = ""
	// ConflictAbort aborts the migration: the connection already there
	// keeps the tuple (the paper's first policy, and the daemon's default).
	ConflictAbort Conflict = "abort"
	// ConflictPreempt preempts the connection already there: the
	// migrating one takes the tuple, the other is aborted (its translation
	// forgotten; packets of that tuple now belong to the migrating one).
	ConflictPreempt Conflict = "preempt"
)

// ParseConflict reads a policy as the CLI and control requests give it.
func ParseConflict(s string) (Conflict, error) {
	switch c := Conflict(s); c {
	case ConflictAbort, ConflictPreempt:
		return c, nil
	}
	return "", fmt.Errorf("conflict policy %q: want abort or preempt", s)
}

// policy is c's conflict policy, the daemon's default when it has none.
func (e *Engine) policy(c *conn) Conflict {
	if c.conflict != ConflictDefault {
		return c.conflict
	}
	if e.cfg.Conflict != ConflictDefault {
		return e.cfg.Conflict
	}
	return ConflictAbort
}

// SetConflict sets the conflict policy of the connections sel picks (all
// when nil) and returns how many it set.
func (e *Engine) SetConflict(sel func(vcmp.Tuple) bool, p Conflict) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for t, c := range e.conns {
		if sel == nil || sel(t) {
			c.conflict = p
			n++
		}
	}
	return n
}

// holder is the other live connection at this end that travels as phys
// (translated to it, or untranslated with it as its own tuple), if any.
// It looks in the index by physical tuple: every update a peer sends asks
// it, and a scan of all connections made restoring N of them cost N² (at
// 10,000, seconds: issue 20 item 7). Called with e.mu held.
func (e *Engine) holder(c *conn, phys vcmp.Tuple) *conn {
	for _, o := range e.byPhys[phys] {
		if o != c && o.m.State != vcmp.Aborted {
			return o
		}
	}
	return nil
}

// setPhys makes c travel as p, in c and in the index. Every change of a
// connection's physical tuple goes through it. Called with e.mu held.
func (e *Engine) setPhys(c *conn, p vcmp.Tuple) {
	e.unindex(c)
	c.phys = p
	e.byPhys[p] = append(e.byPhys[p], c)
}

// unindex takes c out of the index by physical tuple (it is forgotten, or
// its tuple changes). Called with e.mu held.
func (e *Engine) unindex(c *conn) {
	s := slices.DeleteFunc(e.byPhys[c.phys], func(o *conn) bool { return o == c })
	if len(s) == 0 {
		delete(e.byPhys, c.phys)
		return
	}
	e.byPhys[c.phys] = s
}

// SocketCloser closes the application's socket of a connection (its
// virtual tuple is the socket's own) for real: its next read or write
// fails (ECONNABORTED). kernel.go's is sock_diag SOCK_DESTROY. A
// Translator that has one gets preempted connections closed.
type SocketCloser interface {
	CloseSocket(virtual vcmp.Tuple) error
}

// preempt aborts o, which held the tuple c now takes (policy preempt):
// its translation is forgotten, its helpers stop, and its socket is
// closed, so the application sees the connection end at once instead of
// waiting on a socket whose packets now belong to c until its own timers
// give up. A datapath that cannot close it leaves it (said in the log,
// with why). Called with e.mu held.
func (e *Engine) preempt(o, c *conn) error {
	if o.phys != o.m.Tuple {
		if err := e.tr.Forget(o.m.Tuple); err != nil {
			return fmt.Errorf("vnatd: preempt %v: %w", o.m.Tuple, err)
		}
	}
	e.stopHelpers(o)
	o.m.State = vcmp.Aborted
	e.dir.Forget(o.m.Tuple)
	e.counters["preempted"]++
	e.log.Info("vnat: virtual identification conflict, existing connection preempted", "conn", c.m.Tuple, "preempted", o.m.Tuple, "tuple", o.phys)
	e.closePreempted(o)
	return nil
}

// closePreempted closes o's socket (o was preempted). Called with e.mu held.
func (e *Engine) closePreempted(o *conn) {
	sc, ok := e.tr.(SocketCloser)
	if !ok {
		e.warn("preempt_close_errors", "vnat: preempted connection's socket left open: this datapath cannot close sockets; it ends when its own timers give up", "preempted", o.m.Tuple)
		return
	}
	err := sc.CloseSocket(o.m.Tuple)
	switch {
	case err == nil:
		e.counters["preempted_closed"]++
		e.log.Info("vnat: preempted connection's socket closed", "preempted", o.m.Tuple)
	case errors.Is(err, syscall.ENOENT):
		// Its application closed it already: nothing lingers.
		e.log.Info("vnat: preempted connection's socket was closed already", "preempted", o.m.Tuple)
	default:
		e.warn("preempt_close_errors", "vnat: preempted connection's socket left open; it ends when its own timers give up", "preempted", o.m.Tuple, "err", err)
	}
}
