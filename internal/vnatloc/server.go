package vnatloc

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"time"

	"github.com/onehop/onehop/internal/accept"
	"github.com/onehop/onehop/internal/vcmp"
)

// StreamTimeout bounds one VCMP stream: a locate or refresh exchange is one
// round trip, so a stream that stays longer is a client gone silent (or one
// holding the server's streams on purpose).
const StreamTimeout = 30 * time.Second

// DefaultStreamLimits bound the streams served at once (Config.Streams):
// 64 from one address, as many as a host's agent relays for its VMs at
// once (vnatrelay: 4 per VM) with room to spare; 1024 in all; and a stream
// on which nothing moved for 5 s ends (an exchange is one round trip), so
// idle streams held open give their slots back long before StreamTimeout.
// One source holding its cap leaves the others served (issue 20: a global
// cap of 256 let one external lock everyone out for 30 s).
var DefaultStreamLimits = accept.Limits{PerSource: 64, Total: 1024, Idle: 5 * time.Second}

// SweepEvery is how often Serve deletes expired records from the store.
const SweepEvery = 10 * time.Second

// Serve answers VCMP streams accepted on l until ctx ends, within
// Config.Streams (a source over its cap, or a stream idle too long, is
// closed and counted; a flood that exhausts descriptors is waited out).
// A stream that starts a TLS handshake is an agent's relay channel
// (Config.RelayTLS, ServeRelayed); any other is plain VCMP (ServeStream):
// a sequence of VCMP_BATCH messages of location queries and stores (what a
// daemon's locate walk and refresh send), each answered by one batch. A
// message that does not decode ends its stream; it is counted
// (bad_messages) and logged at most once a second. Serve also sweeps
// expired records every SweepEvery.
func (s *Service) Serve(ctx context.Context, l net.Listener) error {
	go func() { <-ctx.Done(); l.Close() }()
	go func() {
		t := time.NewTicker(SweepEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			if _, err := s.Sweep(ctx); err != nil && ctx.Err() == nil {
				s.log.Error("vnat locations: sweep expired records", "err", err)
			}
		}
	}()
	al := accept.Wrap(l, accept.Options{Name: "location", Limits: s.cfg.Streams, Log: s.log, Stats: s.cfg.Listeners})
	for {
		c, err := al.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return fmt.Errorf("vnat location server: accept: %w", err)
		}
		go func() {
			defer c.Close()
			c.SetDeadline(time.Now().Add(StreamTimeout)) //nolint:errcheck // a TCP conn takes deadlines
			s.serveConn(ctx, c, c.(*accept.Conn).Source())
		}()
	}
}

// Streams are the counts of the server's listener (accept.Stats.Counters:
// streams accepted, refused per source and in total, ended idle, accept
// errors waited out).
func (s *Service) Streams() map[string]uint64 { return s.cfg.Listeners.Counters("location") }

// tlsHandshake is the first byte of a TLS stream (a handshake record);
// a VCMP stream starts with its version, 1.
const tlsHandshake = 0x16

// prefixed is a connection whose first bytes were read already.
type prefixed struct {
	net.Conn
	r io.Reader
}

func (p *prefixed) Read(b []byte) (int, error) { return p.r.Read(b) }

// serveConn tells an agent's relay channel (TLS) from a plain VCMP stream
// by the stream's first byte, and serves it as such.
func (s *Service) serveConn(ctx context.Context, c net.Conn, from netip.Addr) {
	var b [1]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return
	}
	pc := &prefixed{Conn: c, r: io.MultiReader(bytes.NewReader(b[:]), c)}
	if b[0] != tlsHandshake {
		s.ServeStream(ctx, pc, from)
		return
	}
	if s.cfg.RelayTLS == nil {
		s.refuseRelay(from, netip.Addr{}, "", "a relay channel (TLS) to a server that takes none (no TLS configured)")
		return
	}
	tc := tls.Server(pc, s.cfg.RelayTLS)
	if err := tc.HandshakeContext(ctx); err != nil {
		s.refuseRelay(from, netip.Addr{}, "", "a relay channel whose TLS handshake failed (no certificate of the cluster's CA?): "+err.Error())
		return
	}
	st := tc.ConnectionState()
	if len(st.VerifiedChains) == 0 || len(st.PeerCertificates) == 0 {
		// RequireAndVerifyClientCert (New) makes this unreachable.
		s.refuseRelay(from, netip.Addr{}, "", "a relay channel without a verified certificate")
		return
	}
	s.ServeRelayed(ctx, tc, st.PeerCertificates[0].Subject.CommonName, from)
}

// ServeStream answers one plain VCMP stream from a source at from until it
// ends. A stream that starts with VCMP_RELAY claims to speak for a VM, and
// a plain stream proves nothing of its sender (slivers share their host's
// address): it is closed unanswered, counted (refused_relay) and logged.
// Relays come only on the agents' authenticated channel (ServeRelayed).
func (s *Service) ServeStream(ctx context.Context, rw io.ReadWriter, from netip.Addr) {
	first, err := vcmp.ReadFrame(rw)
	if err != nil {
		if !errors.Is(err, io.EOF) {
			s.badStream(from, err)
		}
		return
	}
	if _, cmd, _, _ := vcmp.Header(first); cmd == vcmp.CmdRelay {
		src := netip.Addr{}
		if m, err := vcmp.Decode(first); err == nil {
			src = m.(*vcmp.Relay).Source
		}
		s.refuseRelay(from, src, "", "a relay outside the agents' authenticated channel (TLS with a host's certificate)")
		return
	}
	s.serve(ctx, rw, first, from)
}

// ServeRelayed answers one stream on the agents' authenticated channel: a
// TLS stream from a source at from whose client certificate, signed by the
// cluster's CA, names node (the agents' certificates have CN = the node).
// It must start with VCMP_RELAY, and is served as coming from the VM it
// names only if Config.RelayAllowed says the VM is placed on node;
// otherwise it is closed, counted (refused_relay) and logged.
func (s *Service) ServeRelayed(ctx context.Context, rw io.ReadWriter, node string, from netip.Addr) {
	first, err := vcmp.ReadFrame(rw)
	if err != nil {
		if !errors.Is(err, io.EOF) {
			s.badStream(from, err)
		}
		return
	}
	if _, cmd, _, _ := vcmp.Header(first); cmd != vcmp.CmdRelay {
		s.refuseRelay(from, netip.Addr{}, node, "an agent's channel that does not start with VCMP_RELAY")
		return
	}
	m, err := vcmp.Decode(first)
	if err != nil {
		s.badStream(from, err)
		return
	}
	src := m.(*vcmp.Relay).Source
	ok := false
	if s.cfg.RelayAllowed != nil {
		if ok, err = s.cfg.RelayAllowed(ctx, node, src); err != nil {
			s.rlog.Warn("relay_error", "vnat location server: check a relay", "from", from, "node", node, "source", src, "err", err)
		}
	}
	if !ok {
		s.refuseRelay(from, src, node, "a relay from an agent whose host is not the VM's")
		return
	}
	s.mu.Lock()
	s.counters["relayed_streams"]++
	s.mu.Unlock()
	s.serve(ctx, rw, nil, src)
}

// refuseRelay counts and logs a refused relay (rate-limited per reason).
func (s *Service) refuseRelay(from, source netip.Addr, node, why string) {
	args := []any{"from", from, "why", why}
	if source.IsValid() {
		args = append(args, "source", source)
	}
	if node != "" {
		args = append(args, "node", node)
	}
	s.mu.Lock()
	s.refuse("relay", "relay refused, stream closed", args...)
	s.mu.Unlock()
}

// serve answers the batches of a stream from from, first being its first
// frame if already read.
func (s *Service) serve(ctx context.Context, rw io.ReadWriter, first []byte, from netip.Addr) {
	in := io.MultiReader(bytes.NewReader(first), rw)
	err := vcmp.ServeWholeBatches(struct {
		io.Reader
		io.Writer
	}{in, rw}, func(ms []vcmp.Message) []vcmp.Message { return s.HandleBatch(ctx, ms, from) })
	if err != nil {
		s.badStream(from, err)
	}
}

// badStream counts and logs a stream that carried garbage (a broken one is
// not the sender's fault and is only dropped).
func (s *Service) badStream(from netip.Addr, err error) {
	if errors.Is(err, net.ErrClosed) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, os.ErrDeadlineExceeded) {
		return
	}
	var fe *vcmp.FieldError
	if errors.As(err, &fe) || !isNetErr(err) {
		s.mu.Lock()
		s.counters["bad_messages"]++
		s.rlog.Warn("bad_message", "vnat location server: bad message, stream closed", "from", from, "err", err)
		s.mu.Unlock()
	}
}

// isNetErr: the stream broke (reset, timeout), rather than carried garbage.
func isNetErr(err error) bool {
	var ne net.Error
	var oe *net.OpError
	return errors.As(err, &ne) || errors.As(err, &oe)
}
