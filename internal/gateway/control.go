package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// ControlDir holds one control socket per network namespace.
const ControlDir = "/run/onehop/gateway"

// DefaultControl is the control socket of the gateway of the caller's
// network namespace, named by the namespace's inode (/run is shared by
// every namespace; the inode is not), so `onehop lab exec gw -- onehop
// gateway status` reaches gw's daemon and no other.
func DefaultControl() (string, error) {
	fi, err := os.Stat("/proc/self/ns/net")
	if err != nil {
		return "", fmt.Errorf("gateway: this process's network namespace: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return "", errors.New("gateway: this process's network namespace: no inode")
	}
	return filepath.Join(ControlDir, fmt.Sprintf("netns-%d.sock", st.Ino)), nil
}

// Request is one control request (one JSON line).
type Request struct {
	Op string `json:"op"` // status
}

// Reply is the daemon's answer (one JSON line).
type Reply struct {
	Error    string            `json:"error,omitempty"`
	Paths    []PathStatus      `json:"paths,omitempty"`
	Conns    []ConnStatus      `json:"conns,omitempty"`
	Counters map[string]uint64 `json:"counters,omitempty"`
}

func (e *Engine) answer(req Request) Reply {
	switch req.Op {
	case "status":
		paths, conns := e.Status()
		return Reply{Paths: paths, Conns: conns, Counters: e.Counters()}
	}
	return Reply{Error: fmt.Sprintf("unknown control request %q (want status)", req.Op)}
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
			return fmt.Errorf("gateway: control: %w", err)
		}
		go func() {
			defer c.Close()
			if err := c.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
				return
			}
			var req Request
			if err := json.NewDecoder(bufio.NewReader(c)).Decode(&req); err != nil {
				json.NewEncoder(c).Encode(Reply{Error: "bad request: " + err.Error()}) //nolint:errcheck // the client went away
				return
			}
			json.NewEncoder(c).Encode(e.answer(req)) //nolint:errcheck // the client went away
		}()
	}
}

// Ask sends one request to the daemon behind socket path and returns its reply.
func Ask(path string, req Request) (Reply, error) {
	c, err := net.DialTimeout("unix", path, 2*time.Second)
	if err != nil {
		return Reply{}, fmt.Errorf("gateway daemon at %s: %w (is `onehop gateway run` running in this network namespace?)", path, err)
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		return Reply{}, err
	}
	if err := json.NewEncoder(c).Encode(req); err != nil {
		return Reply{}, fmt.Errorf("gateway daemon at %s: send: %w", path, err)
	}
	var r Reply
	if err := json.NewDecoder(c).Decode(&r); err != nil {
		return Reply{}, fmt.Errorf("gateway daemon at %s: reply: %w", path, err)
	}
	if r.Error != "" {
		return r, errors.New(r.Error)
	}
	return r, nil
}
