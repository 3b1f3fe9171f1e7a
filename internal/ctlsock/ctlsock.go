// Package ctlsock is the control socket of onehop's per-namespace daemons
// (the gateway, the VNAT daemon): a unix socket, mode 0600, named by the
// network namespace, on which a client sends one JSON request line and
// reads one JSON reply line.
//
// A reply is a JSON object; a failed request carries an "error" field
// with the message, which Ask returns as a *RemoteError. The server reads
// at most MaxRequest bytes of a request and waits at most Timeout for it,
// so a client can neither grow a daemon's memory nor hold its goroutine.
package ctlsock

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"github.com/onehop/onehop/internal/accept"
)

// Defaults of a Server's limits.
const (
	DefaultMaxRequest    = 64 << 10
	DefaultTimeout       = 10 * time.Second
	DefaultHandleTimeout = 30 * time.Second
)

// Server answers requests of type Req with replies of type Rep, which
// must marshal to a JSON object (the error, if any, is added to it).
type Server[Req, Rep any] struct {
	// Handle answers one request; its error goes to the client as the
	// reply's "error" (beside whatever Rep says, e.g. a count so far).
	// ctx ends with the server's, or after HandleTimeout.
	Handle func(ctx context.Context, req Req) (Rep, error)
	// After, if set, runs once the reply to req is written (or could not
	// be): for a request whose effect must wait for the answer to be out,
	// such as stopping the daemon.
	After func(req Req, rep Rep, err error)
	// MaxRequest bounds a request line in bytes (DefaultMaxRequest if 0).
	MaxRequest int
	// Timeout bounds the wait for the request, and again the writing of
	// the reply (DefaultTimeout if 0).
	Timeout time.Duration
	// HandleTimeout bounds Handle (DefaultHandleTimeout if 0).
	HandleTimeout time.Duration
	// Limits bound the connections at once (zero fields: DefaultLimits);
	// what passes them, and the refusals, count in Stats (nil: nowhere
	// outside the listener) under the name "control".
	Limits accept.Limits
	Stats  *accept.Stats
	// Log takes the listener's refusals, rate-limited (nil: slog.Default()).
	Log *slog.Logger
}

// DefaultLimits bound a control socket: its clients are root's tools, one
// request each, so a few dozen at once is plenty; every connection is one
// source (a unix socket), and a request's wait is bounded by Timeout.
var DefaultLimits = accept.Limits{Total: 64}

// Serve answers on l until ctx ends, then closes l (a *Listener removes
// its socket file) and returns once every connection it took is done;
// connections still open then are cut short. It returns nil when ctx
// ended, the error of Accept otherwise.
func (s *Server[Req, Rep]) Serve(ctx context.Context, nl net.Listener) error {
	/* out of descriptors or memory for a moment, the listener waits and
	   accepts again rather than end the control socket */
	l := accept.Wrap(nl, accept.Options{Name: "control", Limits: s.Limits.Or(DefaultLimits), Stats: s.Stats, Log: s.Log})
	stop := context.AfterFunc(ctx, func() { l.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := l.Accept()
		if err != nil {
			/* again, so that the close (and the removal of the socket)
			   is over when Serve returns: the AfterFunc may be midway */
			l.Close() //nolint:errcheck // a second close says nothing new
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("control socket: accept: %w", err)
		}
		wg.Go(func() { s.conn(ctx, c) })
	}
}

// errTooLong is a request over MaxRequest.
var errTooLong = errors.New("too long")

func (s *Server[Req, Rep]) conn(ctx context.Context, c net.Conn) {
	defer c.Close()
	// The server ending cuts every wait on this connection short.
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) }) //nolint:errcheck // the conn is closing anyway
	defer stop()
	timeout := orDefault(s.Timeout, DefaultTimeout)
	limit := s.MaxRequest
	if limit <= 0 {
		limit = DefaultMaxRequest
	}
	if err := c.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return
	}
	line, err := readLine(c, limit)
	var req Req
	switch {
	case errors.Is(err, io.EOF):
		return // the client went away without asking
	case errors.Is(err, errTooLong):
		s.fail(c, timeout, fmt.Sprintf("request refused: longer than %d bytes", limit))
		return
	case errors.Is(err, os.ErrDeadlineExceeded):
		if ctx.Err() == nil {
			s.fail(c, timeout, fmt.Sprintf("no request within %v", timeout))
		}
		return
	case err != nil:
		return
	}
	if err := decode(line, &req); err != nil {
		s.fail(c, timeout, "bad request: "+err.Error())
		return
	}
	hctx, cancel := context.WithTimeout(ctx, orDefault(s.HandleTimeout, DefaultHandleTimeout))
	rep, herr := s.Handle(hctx, req)
	cancel()
	if b, err := encode(rep, herr); err != nil {
		s.fail(c, timeout, "reply: "+err.Error())
	} else if err := c.SetWriteDeadline(time.Now().Add(timeout)); err == nil {
		c.Write(b) //nolint:errcheck // the client went away
	}
	if s.After != nil {
		s.After(req, rep, herr)
	}
}

// fail sends the reply {"error": msg}: the request never reached Handle.
func (s *Server[Req, Rep]) fail(c net.Conn, timeout time.Duration, msg string) {
	b, err := json.Marshal(map[string]string{"error": msg})
	if err != nil {
		return
	}
	if err := c.SetWriteDeadline(time.Now().Add(timeout)); err != nil {
		return
	}
	c.Write(append(b, '\n')) //nolint:errcheck // the client went away
}

// readLine reads one line of at most limit bytes (the newline not counted;
// a last line without one counts too) and never buffers more than that.
func readLine(r io.Reader, limit int) ([]byte, error) {
	line, err := bufio.NewReader(io.LimitReader(r, int64(limit)+1)).ReadBytes('\n')
	switch {
	case err == nil:
		return line, nil
	case !errors.Is(err, io.EOF):
		return nil, err
	case len(line) > limit:
		return nil, errTooLong // the limit ran out before a newline
	case len(bytes.TrimSpace(line)) == 0:
		return nil, io.EOF
	}
	return line, nil
}

// decode reads one JSON value from line into v: unknown fields and
// anything after the value are errors, so a mistyped request is refused
// rather than half understood.
func decode(line []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(line))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		return err
	}
	if d.More() {
		return errors.New("more than one JSON value on the line")
	}
	return nil
}

// encode is rep as one JSON line, with "error" set to herr's message if
// herr is not nil.
func encode(rep any, herr error) ([]byte, error) {
	b, err := json.Marshal(rep)
	if err != nil {
		return nil, err
	}
	if herr != nil {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(b, &m); err != nil {
			return nil, fmt.Errorf("reply is not a JSON object: %w", err)
		}
		if m == nil {
			m = map[string]json.RawMessage{}
		}
		if m["error"], err = json.Marshal(herr.Error()); err != nil {
			return nil, err
		}
		if b, err = json.Marshal(m); err != nil {
			return nil, err
		}
	}
	return append(b, '\n'), nil
}

func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// DialError is an Ask that reached no daemon: no socket, or nobody
// listening on it.
type DialError struct{ Err error }

func (e *DialError) Error() string { return e.Err.Error() }
func (e *DialError) Unwrap() error { return e.Err }

// RemoteError is a daemon's refusal of a request: its message, as it said it.
type RemoteError struct{ Msg string }

func (e *RemoteError) Error() string { return e.Msg }

// dialTimeout bounds connecting: a live daemon accepts at once.
const dialTimeout = 2 * time.Second

// Client asks one kind of daemon, and names it in its errors.
type Client[Req, Rep any] struct {
	Name    string        // the daemon, as errors name it: "gateway daemon"
	Run     string        // the command that starts one: "onehop gateway run"
	Timeout time.Duration // bounds a whole exchange (DefaultTimeout if 0)
}

// Ask is the package's Ask, its errors saying which daemon at which path,
// and, when none answers, which command starts one. The daemon's refusal
// stays its own message.
func (cl Client[Req, Rep]) Ask(path string, req Req) (Rep, error) {
	r, err := Ask[Req, Rep](path, req, orDefault(cl.Timeout, DefaultTimeout))
	var de *DialError
	var re *RemoteError
	switch {
	case errors.As(err, &de):
		return r, fmt.Errorf("%s at %s: %w (is `%s` running in this network namespace?)", cl.Name, path, err, cl.Run)
	case errors.As(err, &re):
		return r, err
	case err != nil:
		return r, fmt.Errorf("%s at %s: %w", cl.Name, path, err)
	}
	return r, nil
}

// Ask sends req to the daemon behind the socket at path and returns its
// reply; the whole exchange takes at most timeout. A reply that carries
// an error is returned too, with a *RemoteError.
func Ask[Req, Rep any](path string, req Req, timeout time.Duration) (Rep, error) {
	var rep Rep
	c, err := net.DialTimeout("unix", path, dialTimeout)
	if err != nil {
		return rep, &DialError{Err: err}
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return rep, err
	}
	b, err := json.Marshal(req)
	if err != nil {
		return rep, fmt.Errorf("request: %w", err)
	}
	_, serr := c.Write(append(b, '\n'))
	// Even when the send failed, the daemon may have said why (a request
	// it refused half read): read its reply before giving up.
	var wire struct {
		Error string `json:"error"`
	}
	line, rerr := bufio.NewReader(c).ReadBytes('\n')
	if rerr != nil && !(errors.Is(rerr, io.EOF) && len(line) > 0) {
		if serr != nil {
			return rep, fmt.Errorf("send: %w", serr)
		}
		return rep, fmt.Errorf("reply: %w", rerr)
	}
	if err := json.Unmarshal(line, &wire); err != nil {
		return rep, fmt.Errorf("reply: %w", err)
	}
	if err := json.Unmarshal(line, &rep); err != nil {
		return rep, fmt.Errorf("reply: %w", err)
	}
	if wire.Error != "" {
		return rep, &RemoteError{Msg: wire.Error}
	}
	if serr != nil {
		return rep, fmt.Errorf("send: %w", serr)
	}
	return rep, nil
}
