package vnatd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/onehop/onehop/internal/accept"
	"github.com/onehop/onehop/internal/ctlsock"
	"github.com/onehop/onehop/internal/vcmp"
)

// ControlDir holds one control socket per network namespace.
const ControlDir = "/run/onehop/vnat"

// DefaultControl is the control socket of the daemon of the caller's
// network namespace: named by the namespace's inode, so `onehop lab exec
// m1 -- onehop vnat status` reaches m1's daemon and no other (/run is
// shared by every namespace; the inode is not).
func DefaultControl() (string, error) { return ctlsock.DefaultPath(ControlDir) }

// ListenControl binds the control socket at path: see ctlsock.Listen.
func ListenControl(path string) (*ctlsock.Listener, error) { return ctlsock.Listen(path) }

// netnsInode is the inode of the caller's network namespace.
func netnsInode() (uint64, error) {
	ino, err := ctlsock.NetnsInode()
	if err != nil {
		return 0, fmt.Errorf("vnatd: %w", err)
	}
	return ino, nil
}

// Request is one control request (one JSON line).
type Request struct {
	Op   string `json:"op"`             // status, suspend, resume, stop
	All  bool   `json:"all,omitempty"`  // suspend: every connection
	Conn string `json:"conn,omitempty"` // suspend: "tcp LOCAL->REMOTE" (virtual)
	// Conflict (suspend): the connections' §3.4.2 policy, abort or
	// preempt; "" leaves it as it is.
	Conflict string `json:"conflict,omitempty"`
}

// Reply is the daemon's answer (one JSON line).
type Reply struct {
	Error    string            `json:"error,omitempty"`
	Conns    []ConnStatus      `json:"conns,omitempty"`
	Counters map[string]uint64 `json:"counters,omitempty"`
	Count    int               `json:"count,omitempty"`   // connections suspended or resumed
	Restore  *RestoreReport    `json:"restore,omitempty"` // status: the last restore after a move
}

// ParseTuple reads "tcp 10.0.0.1:4000->10.0.0.2:22" (the form status prints).
func ParseTuple(s string) (vcmp.Tuple, error) {
	proto, rest, ok := strings.Cut(strings.TrimSpace(s), " ")
	if !ok {
		return vcmp.Tuple{}, fmt.Errorf("connection %q: want \"tcp|udp LOCAL:PORT->REMOTE:PORT\"", s)
	}
	var t vcmp.Tuple
	switch strings.ToLower(proto) {
	case "tcp":
		t.Proto = vcmp.TCP
	case "udp":
		t.Proto = vcmp.UDP
	default:
		return t, fmt.Errorf("connection %q: protocol %q is not tcp or udp", s, proto)
	}
	l, r, ok := strings.Cut(strings.TrimSpace(rest), "->")
	if !ok {
		return t, fmt.Errorf("connection %q: no \"->\" between local and remote", s)
	}
	var err error
	if t.Local, err = netip.ParseAddrPort(strings.TrimSpace(l)); err != nil {
		return t, fmt.Errorf("connection %q: local end: %w", s, err)
	}
	if t.Remote, err = netip.ParseAddrPort(strings.TrimSpace(r)); err != nil {
		return t, fmt.Errorf("connection %q: remote end: %w", s, err)
	}
	return t, nil
}

// answer carries out one control request.
func (e *Engine) answer(ctx context.Context, req Request) (Reply, error) {
	switch req.Op {
	case "status":
		if err := e.Sync(); err != nil {
			return Reply{}, err
		}
		return Reply{Conns: e.Status(), Counters: e.Counters(), Restore: e.LastRestore()}, nil
	case "suspend":
		var sel func(vcmp.Tuple) bool
		if !req.All {
			want, err := ParseTuple(req.Conn)
			if err != nil {
				return Reply{}, err
			}
			sel = func(t vcmp.Tuple) bool { return t == want }
		}
		if req.Conflict != "" {
			p, err := ParseConflict(req.Conflict)
			if err != nil {
				return Reply{}, fmt.Errorf("suspend: %w", err)
			}
			e.SetConflict(sel, p)
		}
		n, err := e.Suspend(ctx, sel)
		if err == nil && n == 0 && !req.All {
			err = fmt.Errorf("no active connection %s here (see onehop vnat status)", req.Conn)
		}
		return Reply{Count: n}, err
	case "resume":
		n, err := e.Resume(ctx)
		return Reply{Count: n}, err
	case "stop":
		if e.stopper() == nil {
			return Reply{}, errors.New("this daemon does not stop on request")
		}
		return Reply{}, nil // stopped once the reply is out (after)
	}
	return Reply{}, fmt.Errorf("unknown control request %q (want status, suspend, resume or stop)", req.Op)
}

// after stops the daemon once its reply to a stop is out, so the client
// hears that it is stopping.
func (e *Engine) after(req Request, _ Reply, err error) {
	if req.Op == "stop" && err == nil {
		e.stopper()()
	}
}

func (e *Engine) stopper() func() {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.stop
}

// ServeControl answers control requests on l until ctx ends.
func (e *Engine) ServeControl(ctx context.Context, l net.Listener) error {
	return e.serveControl(ctx, l, nil, nil)
}

// serveControl is ServeControl counting its listener in stats (nil: none).
func (e *Engine) serveControl(ctx context.Context, l net.Listener, stats *accept.Stats, log *slog.Logger) error {
	s := &ctlsock.Server[Request, Reply]{Handle: e.answer, After: e.after, Stats: stats, Log: log}
	if err := s.Serve(ctx, l); err != nil {
		return fmt.Errorf("vnatd: %w", err)
	}
	return nil
}

// client asks the VNAT daemon; a suspend waits for the peers, up to the
// daemon's ctlsock.DefaultHandleTimeout.
var client = ctlsock.Client[Request, Reply]{Name: "vnat daemon", Run: "onehop vnat run", Timeout: 60 * time.Second}

// Ask sends one request to the daemon behind socket path and returns its
// reply; the daemon's refusal comes back as its own message.
func Ask(path string, req Request) (Reply, error) { return client.Ask(path, req) }
