package vnatloc

import (
	"bytes"
	"context"
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
// closed and counted; a flood that exhausts descriptors is waited out):
// every stream is a
// sequence of VCMP_BATCH messages of location queries and stores (what a
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
			s.ServeStream(ctx, c, c.(*accept.Conn).Source())
		}()
	}
}

// Streams are the counts of the server's listener (accept.Stats.Counters:
// streams accepted, refused per source and in total, ended idle, accept
// errors waited out).
func (s *Service) Streams() map[string]uint64 { return s.cfg.Listeners.Counters("location") }

// ServeStream answers one VCMP stream from a source at from until it ends.
// A stream that starts with VCMP_RELAY is a host's agent relaying one of
// its VMs (docs/vnat-location.md): it is served as coming from the VM, if
// Config.RelayAllowed says the sender is the host the VM is on; otherwise
// it is closed, counted (refused_relay) and logged.
func (s *Service) ServeStream(ctx context.Context, rw io.ReadWriter, from netip.Addr) {
	first, err := vcmp.ReadFrame(rw)
	if err != nil {
		if !errors.Is(err, io.EOF) {
			s.badStream(from, err)
		}
		return
	}
	if _, cmd, _, _ := vcmp.Header(first); cmd == vcmp.CmdRelay {
		m, err := vcmp.Decode(first)
		if err != nil {
			s.badStream(from, err)
			return
		}
		src := m.(*vcmp.Relay).Source
		ok := false
		if s.cfg.RelayAllowed != nil {
			if ok, err = s.cfg.RelayAllowed(ctx, from, src); err != nil {
				s.rlog.Warn("relay_error", "vnat location server: check a relay", "from", from, "source", src, "err", err)
			}
		}
		if !ok {
			s.mu.Lock()
			s.refuse("relay", "relay from a sender that is not the source's host", "from", from, "source", src)
			s.mu.Unlock()
			return
		}
		s.mu.Lock()
		s.counters["relayed_streams"]++
		s.mu.Unlock()
		from, first = src, nil
	}
	in := io.MultiReader(bytes.NewReader(first), rw)
	err = vcmp.ServeWholeBatches(struct {
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
