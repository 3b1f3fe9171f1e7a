package vnatd

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/onehop/onehop/internal/vcmp"
)

// ControlDir holds one control socket per network namespace.
const ControlDir = "/run/onehop/vnat"

// DefaultControl is the control socket of the daemon of the caller's
// network namespace: named by the namespace's inode, so `onehop lab exec
// m1 -- onehop vnat status` reaches m1's daemon and no other (/run is
// shared by every namespace; the inode is not).
func DefaultControl() (string, error) {
	ino, err := netnsInode()
	if err != nil {
		return "", err
	}
	return filepath.Join(ControlDir, fmt.Sprintf("netns-%d.sock", ino)), nil
}

// netnsInode is the inode of the caller's network namespace.
func netnsInode() (uint64, error) {
	fi, err := os.Stat("/proc/self/ns/net")
	if err != nil {
		return 0, fmt.Errorf("vnatd: this process's network namespace: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, errors.New("vnatd: this process's network namespace: no inode")
	}
	return st.Ino, nil
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
func (e *Engine) answer(ctx context.Context, req Request) Reply {
	switch req.Op {
	case "status":
		if err := e.Sync(); err != nil {
			return Reply{Error: err.Error()}
		}
		return Reply{Conns: e.Status(), Counters: e.Counters(), Restore: e.LastRestore()}
	case "suspend":
		var sel func(vcmp.Tuple) bool
		if !req.All {
			want, err := ParseTuple(req.Conn)
			if err != nil {
				return Reply{Error: err.Error()}
			}
			sel = func(t vcmp.Tuple) bool { return t == want }
		}
		if req.Conflict != "" {
			p, err := ParseConflict(req.Conflict)
			if err != nil {
				return Reply{Error: "suspend: " + err.Error()}
			}
			e.SetConflict(sel, p)
		}
		n, err := e.Suspend(ctx, sel)
		r := Reply{Count: n}
		if err != nil {
			r.Error = err.Error()
		} else if n == 0 && !req.All {
			r.Error = fmt.Sprintf("no active connection %s here (see onehop vnat status)", req.Conn)
		}
		return r
	case "resume":
		n, err := e.Resume(ctx)
		r := Reply{Count: n}
		if err != nil {
			r.Error = err.Error()
		}
		return r
	case "stop":
		e.mu.Lock()
		stop := e.stop
		e.mu.Unlock()
		if stop == nil {
			return Reply{Error: "this daemon does not stop on request"}
		}
		return Reply{} // ServeControl stops it once the reply is out
	}
	return Reply{Error: fmt.Sprintf("unknown control request %q (want status, suspend, resume or stop)", req.Op)}
}

// ServeControl answers control requests on l until ctx ends.
func (e *Engine) ServeControl(ctx context.Context, l net.Listener) error {
	go func() { <-ctx.Done(); l.Close() }()
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("vnatd: control: %w", err)
		}
		go func() {
			defer c.Close()
			var req Request
			if err := json.NewDecoder(bufio.NewReader(c)).Decode(&req); err != nil {
				json.NewEncoder(c).Encode(Reply{Error: "bad request: " + err.Error()}) //nolint:errcheck // the client went away
				return
			}
			rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			r := e.answer(rctx, req)
			json.NewEncoder(c).Encode(r) //nolint:errcheck // the client went away
			if req.Op == "stop" && r.Error == "" {
				e.mu.Lock()
				stop := e.stop
				e.mu.Unlock()
				stop()
			}
		}()
	}
}

// Ask sends one request to the daemon behind socket path and returns its reply.
func Ask(path string, req Request) (Reply, error) {
	c, err := net.DialTimeout("unix", path, 2*time.Second)
	if err != nil {
		return Reply{}, fmt.Errorf("vnat daemon at %s: %w (is `onehop vnat run` running in this network namespace?)", path, err)
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(60 * time.Second)); err != nil {
		return Reply{}, err
	}
	if err := json.NewEncoder(c).Encode(req); err != nil {
		return Reply{}, fmt.Errorf("vnat daemon at %s: send: %w", path, err)
	}
	var r Reply
	if err := json.NewDecoder(c).Decode(&r); err != nil {
		return Reply{}, fmt.Errorf("vnat daemon at %s: reply: %w", path, err)
	}
	if r.Error != "" {
		return r, errors.New(r.Error)
	}
	return r, nil
}
