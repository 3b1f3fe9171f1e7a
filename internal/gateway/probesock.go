package gateway

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/internal/lisp"
	"github.com/onehop/onehop/internal/ratelog"
)

// randomNonce is a probe's nonce: unguessable, so an off-path forger
// cannot answer for a dead locator.
func randomNonce() uint64 {
	var b [8]byte
	rand.Read(b[:]) //nolint:errcheck // never fails (crypto/rand documents it)
	return binary.BigEndian.Uint64(b[:])
}

// probeSocket is path's probe socket: UDP from the path's RLOC, bound to
// the path's interface so a probe leaves by the path it tests.
func probeSocket(ctx context.Context, p Path) (*net.UDPConn, error) {
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) { serr = unix.BindToDevice(int(fd), p.Dev) }); err != nil {
			return err
		}
		if serr != nil {
			return fmt.Errorf("setsockopt SO_BINDTODEVICE %s: %w", p.Dev, serr)
		}
		return nil
	}}
	pc, err := lc.ListenPacket(ctx, "udp4", netip.AddrPortFrom(p.RLOC, 0).String())
	if err != nil {
		return nil, fmt.Errorf("--path dev=%s: rloc probe socket: %w", p.Dev, err)
	}
	return pc.(*net.UDPConn), nil
}

// runProber probes the locators the engine's connections use every
// cfg.ProbeInterval and applies what the prober finds, until ctx ends.
func runProber(ctx context.Context, e *Engine, pr *Prober, cfg *Config, log *slog.Logger) error {
	rl := ratelog.New(log, 5, 10*time.Second, time.Now)
	socks := make([]*net.UDPConn, len(cfg.Paths))
	for i, p := range cfg.Paths {
		pc, err := probeSocket(ctx, p)
		if err != nil {
			for _, s := range socks[:i] {
				s.Close()
			}
			return fmt.Errorf("gateway: %w", err)
		}
		socks[i] = pc
	}
	defer func() {
		for _, s := range socks {
			s.Close()
		}
	}()
	for i, pc := range socks {
		go readProbeReplies(e, pr, i, pc, rl)
	}
	/* ticks finer than the interval: each locator keeps its own schedule */
	t := time.NewTicker(max(cfg.ProbeInterval/5, 20*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		for _, w := range e.ProbeTargets() {
			pr.Watch(w.Key, w.EID)
		}
		probes, changes := pr.Tick()
		for _, c := range changes {
			e.SetRLOCUp(c.Key.Path, c.Key.RLOC, c.Up)
		}
		for _, p := range probes {
			path := cfg.Paths[p.Key.Path]
			req := lisp.NewProbe(p.Nonce, path.RLOC, p.EID)
			b, err := req.Encode()
			if err != nil {
				rl.Warn("probe-encode", "gateway: encoding an rloc probe", "rloc", p.Key.RLOC, "eid", p.EID, "err", err)
				continue
			}
			/* a failed send (the link is down, no route) is a probe
			   missed like any other */
			if _, err := socks[p.Key.Path].WriteToUDPAddrPort(b, netip.AddrPortFrom(p.Key.RLOC, lisp.ControlPort)); err != nil {
				rl.Info("probe-send:"+path.Name, "gateway: sending an rloc probe", "path", path.Name, "rloc", p.Key.RLOC, "err", err)
			}
		}
	}
}

// readProbeReplies hands the prober each Map-Reply with the P bit that
// arrives on path's socket, until the socket is closed.
func readProbeReplies(e *Engine, pr *Prober, path int, pc *net.UDPConn, rl *ratelog.Logger) {
	buf := make([]byte, lisp.MaxMessageLen+1)
	for {
		n, src, err := pc.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			rl.Warn("probe-read", "gateway: reading rloc probe replies", "path", path, "err", err)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		rep, err := lisp.DecodeMapReply(buf[:n])
		if err != nil || !rep.Probe {
			pr.NotAReply()
			continue
		}
		if c, ok := pr.Answer(path, src, rep.Nonce); ok {
			e.SetRLOCUp(c.Key.Path, c.Key.RLOC, c.Up)
		}
	}
}
