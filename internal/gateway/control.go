package gateway

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/onehop/onehop/internal/ctlsock"
)

// ControlDir holds one control socket per network namespace.
const ControlDir = "/run/onehop/gateway"

// DefaultControl is the control socket of the gateway of the caller's
// network namespace, named by the namespace's inode (/run is shared by
// every namespace; the inode is not), so `onehop lab exec gw -- onehop
// gateway status` reaches gw's daemon and no other.
func DefaultControl() (string, error) { return ctlsock.DefaultPath(ControlDir) }

// ListenControl binds the control socket at path: see ctlsock.Listen.
func ListenControl(path string) (*ctlsock.Listener, error) { return ctlsock.Listen(path) }

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

func (e *Engine) answer(_ context.Context, req Request) (Reply, error) {
	switch req.Op {
	case "status":
		paths, conns := e.Status()
		return Reply{Paths: paths, Conns: conns, Counters: e.Counters()}, nil
	}
	return Reply{}, fmt.Errorf("unknown control request %q (want status)", req.Op)
}

// ServeControl answers control requests on l until ctx ends.
func (e *Engine) ServeControl(ctx context.Context, l net.Listener) error {
	s := &ctlsock.Server[Request, Reply]{Handle: e.answer}
	if err := s.Serve(ctx, l); err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	return nil
}

// client asks the gateway; status answers at once.
var client = ctlsock.Client[Request, Reply]{Name: "gateway daemon", Run: "onehop gateway run", Timeout: 10 * time.Second}

// Ask sends one request to the daemon behind socket path and returns its
// reply; the daemon's refusal comes back as its own message.
func Ask(path string, req Request) (Reply, error) { return client.Ask(path, req) }
