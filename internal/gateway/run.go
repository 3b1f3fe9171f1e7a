package gateway

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os/exec"
	"syscall"
	"time"

	"github.com/onehop/onehop/internal/accept"
	"github.com/onehop/onehop/internal/lisp"
	"github.com/onehop/onehop/internal/opsport"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// KernelDialer dials with congestion control cc on every socket: MPTCP
// from the path's EID, or plain TCP by the ordinary routes.
func KernelDialer(cc string) Dialer {
	return func(ctx context.Context, from netip.Addr, to netip.AddrPort, mptcp bool) (*net.TCPConn, error) {
		d := net.Dialer{Timeout: 10 * time.Second, Control: ccControl(cc)}
		d.SetMultipathTCP(mptcp)
		if from.IsValid() {
			d.LocalAddr = &net.TCPAddr{IP: from.AsSlice()}
		}
		c, err := d.DialContext(ctx, "tcp4", to.String())
		if err != nil {
			return nil, err
		}
		return c.(*net.TCPConn), nil
	}
}

func ccControl(cc string) func(string, string, syscall.RawConn) error {
	return func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) { serr = SetCongestion(fd, cc) }); err != nil {
			return err
		}
		return serr
	}
}

func nft(script string) error {
	cmd := exec.Command("nft", "-f", "-")
	cmd.Stdin = bytes.NewBufferString(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("nft: %w: %s", err, bytes.TrimSpace(out))
	}
	return nil
}

// readInfraDropped reads the nftables counter of the users' packets
// dropped for infrastructure addresses.
func readInfraDropped() (uint64, error) {
	out, err := exec.Command("nft", "-j", "list", "counter", "ip", NFTTable, NFTInfraCounter).Output()
	if err != nil {
		return 0, fmt.Errorf("nft list counter %s: %w", NFTInfraCounter, err)
	}
	return ParseNFTCounter(out, NFTInfraCounter)
}

// Run is `onehop gateway run`: it sets the namespace up (MPTCP with the
// userspace path manager, the EIDs, policy routing, the nftables TPROXY
// table), proxies until ctx ends, and takes down everything it set up.
func Run(ctx context.Context, cfg *Config, res Resolver, log *slog.Logger) (err error) {
	if err := cfg.Validate(); err != nil {
		return err
	}
	var ops net.Listener
	if cfg.MetricsAddr != "" {
		// First: a bad or taken address fails before anything is set up.
		if ops, err = opsport.Listen("--metrics-addr", cfg.MetricsAddr); err != nil {
			return fmt.Errorf("gateway run: %w", err)
		}
		defer ops.Close()
	}
	var undo []func() error
	defer func() {
		for i := len(undo) - 1; i >= 0; i-- {
			if uerr := undo[i](); uerr != nil {
				log.Warn("gateway: teardown", "err", uerr)
			}
		}
	}()
	for _, s := range [][2]string{{"net.mptcp.enabled", "1"}, {"net.mptcp.pm_type", "1"}} {
		old, err := WriteSysctl(s[0], s[1])
		if err != nil {
			return fmt.Errorf("gateway run: %w", err)
		}
		undo = append(undo, func() error { _, err := WriteSysctl(s[0], old); return err })
	}
	for _, p := range cfg.Paths {
		if _, err := netlink.LinkByName(p.Dev); err != nil {
			return fmt.Errorf("gateway run: --path dev=%s: %w", p.Dev, err)
		}
	}
	for _, i := range cfg.Intercept {
		if _, err := netlink.LinkByName(i); err != nil {
			return fmt.Errorf("gateway run: --intercept %s: %w", i, err)
		}
	}
	routes, err := NewRoutes(cfg)
	if err != nil {
		return fmt.Errorf("gateway run: %w", err)
	}
	undo = append(undo, routes.Close)

	lc := net.ListenConfig{Control: func(network, address string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			/* IP_TRANSPARENT: accept connections for addresses that are not
			   ours (TPROXY); the accepted socket's local address is the
			   user's original destination */
			if serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_TRANSPARENT, 1); serr != nil {
				serr = fmt.Errorf("setsockopt IP_TRANSPARENT: %w", serr)
				return
			}
			serr = SetCongestion(fd, cfg.Congestion)
		}); err != nil {
			return err
		}
		return serr
	}}
	/* the user speaks plain TCP; Go would make a listener MPTCP by default */
	lc.SetMultipathTCP(false)
	ln, err := lc.Listen(ctx, "tcp4", fmt.Sprintf("127.0.0.1:%d", cfg.ListenPort))
	if err != nil {
		return fmt.Errorf("gateway run: --listen-port %d: %w", cfg.ListenPort, err)
	}
	undo = append(undo, ln.Close)

	if err := nft(NFTRules(cfg)); err != nil {
		return fmt.Errorf("gateway run: nftables table %s: %w", NFTTable, err)
	}
	undo = append(undo, func() error { return nft(NFTDelete()) })

	ctl := cfg.Control
	if ctl == "" {
		if ctl, err = DefaultControl(); err != nil {
			return err
		}
	}
	cl, err := ListenControl(ctl)
	if err != nil {
		return fmt.Errorf("gateway run: --control: %w", err)
	}
	undo = append(undo, cl.Close)

	var pin Pinner = routes
	if cfg.LISP {
		dp, err := openLISP(cfg)
		if err != nil {
			return fmt.Errorf("gateway run: %w", err)
		}
		undo = append(undo, dp.Close)
		pin = NewLISPPinner(cfg, routes, dp)
	}

	var prober *Prober
	if cfg.ProbeInterval > 0 {
		prober = NewProber(cfg.ProbeInterval, cfg.ProbeMisses, time.Now, randomNonce)
	}
	e := NewEngine(cfg, EngineDeps{
		Resolver: res, Find: RouteFinder(cfg), Pin: pin, PM: &NetlinkPM{},
		Dial: KernelDialer(cfg.Congestion), Subflows: ReadSubflows, TCPInfo: ReadTCPInfo, Logger: log,
		Prober: prober, InfraDropped: readInfraDropped,
	})
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if ops != nil {
		reg := prometheus.NewRegistry()
		reg.MustRegister(NewMetrics(e))
		opsport.Serve(ctx, ops, opsport.Config{Daemon: "gateway", Gatherer: reg, Ready: e.Ready, Log: log})
	}
	errc := make(chan error, 5)
	go func() { errc <- e.ServeControl(ctx, cl) }()
	go func() { errc <- watchLinks(ctx, e, cfg) }()
	go func() {
		errc <- WatchSubflowEvents(ctx, e.SubflowEvent, func(err error) {
			e.count("subflow_events_lost")
			e.rl.Warn("events", "gateway: subflow events lost; a join's answer may show as unanswered", "err", err)
		})
	}()
	go func() { errc <- e.serve(ctx, ln.(*net.TCPListener)) }()
	if prober != nil {
		go func() { errc <- runProber(ctx, e, prober, cfg, log) }()
	}
	if cfg.MapServer.IsValid() {
		reg := registrar(cfg, log)
		go func() {
			if err := reg.Run(ctx); err != nil && ctx.Err() == nil {
				errc <- fmt.Errorf("gateway: --map-server %s: %w", cfg.MapServer, err)
			}
		}()
	}
	log.Info("gateway up", "intercept", cfg.Intercept, "listen_port", cfg.ListenPort, "paths", len(cfg.Paths),
		"infrastructure", fmt.Sprint(cfg.InfrastructurePrefixes()),
		"eid_prefix", cfg.EIDPrefix, "congestion", cfg.Congestion, "control", ctl,
		"rloc_probe_interval", cfg.ProbeInterval, "rloc_probe_misses", cfg.ProbeMisses)
	select {
	case <-ctx.Done():
		return nil
	case err := <-errc:
		return err
	}
}

// registrar registers each path's EID behind that path's RLOC (RFC 9301
// Map-Register, authenticated), so the far xTR encapsulates the replies to
// subflow i onto path i.
func registrar(cfg *Config, log *slog.Logger) *lisp.Registrar {
	var recs []lisp.Record
	for _, p := range cfg.Paths {
		recs = append(recs, lisp.Record{
			EID: netip.PrefixFrom(p.EID, 32), TTL: 10 * time.Minute, Authoritative: true,
			Locators: []lisp.Locator{{Addr: p.RLOC, Priority: 1, Weight: 100, Local: true, Reachable: true}},
		})
	}
	return &lisp.Registrar{Server: cfg.MapServer, KeyID: cfg.KeyID, Key: []byte(cfg.MapServerKey), Records: recs, WantMapNotify: true, Log: log}
}

// serve accepts intercepted connections until ctx ends: at most
// --max-conns at once; a flood that exhausts descriptors is waited out.
// No idle timeout: the gateway is transparent to the user's TCP, whose
// idle life is the user's and the server's to decide.
func (e *Engine) serve(ctx context.Context, ln *net.TCPListener) error {
	l := accept.Wrap(ln, accept.Options{Name: "intercept", Limits: accept.Limits{Total: e.cfg.MaxConns}, Log: e.log, Stats: e.listeners})
	go func() { <-ctx.Done(); l.Close() }()
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("gateway: accept: %w", err)
		}
		go func() {
			defer c.Close() // gives the slot back
			e.handle(ctx, c.(*accept.Conn).NetConn().(*net.TCPConn))
		}()
	}
}

func (e *Engine) handle(ctx context.Context, client *net.TCPConn) {
	defer client.Close()
	dest := client.LocalAddr().(*net.TCPAddr).AddrPort()
	from := client.RemoteAddr().(*net.TCPAddr).AddrPort()
	dest = netip.AddrPortFrom(dest.Addr().Unmap(), dest.Port())
	from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
	if !e.admit(from.Addr()) {
		e.rl.Warn("limit:"+from.Addr().String(), "gateway: a user holds --max-per-client connections already; refusing", "client", from.Addr(), "max", e.cfg.MaxPerClient)
		return
	}
	defer e.release(from.Addr())
	octx, cancel := context.WithTimeout(ctx, 15*time.Second)
	c, err := e.Open(octx, from, dest)
	cancel()
	if err != nil {
		e.rl.Warn("open:"+from.Addr().String(), "gateway: cannot reach the destination", "client", from, "dest", dest, "err", err)
		return
	}
	e.Splice(c, client)
	e.Finish(c)
}

// watchLinks turns the paths' link state into SetPathUp calls.
func watchLinks(ctx context.Context, e *Engine, cfg *Config) error {
	ch := make(chan netlink.LinkUpdate, 64)
	done := make(chan struct{})
	defer close(done)
	errs := make(chan error, 1)
	if err := netlink.LinkSubscribeWithOptions(ch, done, netlink.LinkSubscribeOptions{
		ListExisting: true,
		ErrorCallback: func(err error) {
			select {
			case errs <- err:
			default:
			}
		},
	}); err != nil {
		return fmt.Errorf("gateway: watch links: %w", err)
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errs:
			return fmt.Errorf("gateway: watch links: %w", err)
		case u, ok := <-ch:
			if !ok {
				return errors.New("gateway: watch links: subscription ended")
			}
			a := u.Attrs()
			for i, p := range cfg.Paths {
				if p.Dev == a.Name {
					up := a.Flags&net.FlagUp != 0 && a.RawFlags&unix.IFF_LOWER_UP != 0
					e.SetPathUp(i, up)
				}
			}
		}
	}
}
