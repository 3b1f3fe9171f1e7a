package vnatd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/internal/accept"
	"github.com/onehop/onehop/internal/vcmp"
	"github.com/onehop/onehop/internal/vnat"
)

// Options are `onehop vnat run`'s flags.
type Options struct {
	Iface           string   // the endpoint's interface (eth0)
	LocationServers []string // host or host:port, or vcmp://host[:port]
	// AllowUnkeyed is Config.AllowUnkeyed (--allow-unkeyed).
	AllowUnkeyed bool
	// Conflict is the default conflict policy (§3.4.2): "abort" (or
	// "") or "preempt".
	Conflict string
	Control  string // control socket; "" = DefaultControl()
	Cgroup   string // cgroup v2 to attach sockops to; "" = none (sock_diag only)
	Listen   string // VCMP listen address; "" = 0.0.0.0:2031
	// NoKeepaliveHelper turns off the keepalive helper (on by default:
	// while a peer is away, this end answers its own TCP keepalives).
	NoKeepaliveHelper bool
	// FreezeCgroup is a cgroup v2 directory frozen while any peer is
	// away (the generic helper); "" = none.
	FreezeCgroup string
	// MaxAway bounds how long the helpers run for a connection whose
	// peer is away (--max-away; DefaultMaxAway): after it they stop (the
	// application is thawed, its keepalives no longer answered) and its
	// own timeouts decide. 0 = unbounded (until the peer is back).
	MaxAway time.Duration
	// PinDir holds the pinned maps and links ("" = DefaultPinDir(); if
	// that is not on a bpffs the daemon runs unpinned, with a warning).
	PinDir string
	// NoPin pins nothing: the translations end with the daemon.
	NoPin bool
	// KeyFile keeps the agreed keys across a restart when pinned ("" =
	// KeyFilePath of the pin directory); unpinned, nothing is kept.
	KeyFile string
	// Metrics is the address Prometheus metrics are served on ("" = none).
	Metrics string
	// VCMP bounds the VCMP listener's connections (--max-conns,
	// --max-conns-per-source, --idle-timeout); zero fields take
	// DefaultVCMPLimits.
	VCMP   accept.Limits
	Logger *slog.Logger
}

// DefaultMaxAway is --max-away's default: long enough for a suspended
// host to move and resume, short enough that an application is not kept
// frozen for a peer that is never coming back.
const DefaultMaxAway = 10 * time.Minute

// DefaultVCMPLimits bound the VCMP listener. A peer's daemon opens one
// stream per exchange (one batch per peer, a round trip), so 32 at once
// from one address leaves room for many endpoints behind one NAT; 512 in
// all stays far below the descriptors a daemon may hold; a stream with
// nothing moving for 10 s is a peer gone or a flood, not an exchange.
var DefaultVCMPLimits = accept.Limits{PerSource: 32, Total: 512, Idle: 10 * time.Second}

// ParseServer reads one --location-server value: an IPv4 address, with an
// optional port (only vcmp.Port is served today) and an optional vcmp://.
func ParseServer(s string) (netip.Addr, error) {
	h := strings.TrimPrefix(s, "vcmp://")
	if ap, err := netip.ParseAddrPort(h); err == nil {
		if ap.Port() != vcmp.Port {
			return netip.Addr{}, fmt.Errorf("--location-server %q: port %d; VCMP is on %d", s, ap.Port(), vcmp.Port)
		}
		h = ap.Addr().String()
	}
	a, err := netip.ParseAddr(h)
	if err != nil || !a.Is4() {
		return netip.Addr{}, fmt.Errorf("--location-server %q: want an IPv4 address, as vcmp://ADDR[:%d] or ADDR", s, vcmp.Port)
	}
	return a, nil
}

// tcpDialer dials VCMP over TCP with a short timeout: an old place that is
// gone must not hold the walk up.
func tcpDialer(ctx context.Context, a netip.Addr) (io.ReadWriteCloser, error) {
	d := net.Dialer{Timeout: 1500 * time.Millisecond}
	return d.DialContext(ctx, "tcp4", netip.AddrPortFrom(a, vcmp.Port).String())
}

// Run is the daemon: it opens the datapath on the interface, picks up the
// open connections, serves VCMP and the control socket, and restores the
// connections whenever the interface's address changes, until ctx ends.
func Run(ctx context.Context, o Options) error {
	log := o.Logger
	if log == nil {
		log = slog.Default()
	}
	conflict := ConflictAbort
	if o.MaxAway < 0 {
		return fmt.Errorf("vnat run: --max-away %v: want a duration of 0 (unbounded) or more", o.MaxAway)
	}
	if o.Conflict != "" {
		var err error
		if conflict, err = ParseConflict(o.Conflict); err != nil {
			return fmt.Errorf("vnat run --conflict: %w", err)
		}
	}
	if err := o.VCMP.Validate("--max-conns-per-source", "--max-conns", "--idle-timeout"); err != nil {
		return fmt.Errorf("vnat run: %w", err)
	}
	var servers []netip.Addr
	for _, s := range o.LocationServers {
		a, err := ParseServer(s)
		if err != nil {
			return err
		}
		servers = append(servers, a)
	}
	if o.AllowUnkeyed {
		log.Warn("--allow-unkeyed: a connection without agreed keys follows an unauthenticated update from its peer's address (anyone who shares or spoofs that address can move it)")
	}
	var freezer *Freezer
	if o.FreezeCgroup != "" {
		f, err := CgroupFreezer(o.FreezeCgroup)
		if err != nil {
			return fmt.Errorf("vnat run: %w", err)
		}
		freezer = f
	}
	var ml net.Listener
	if o.Metrics != "" {
		l, err := listenMetrics(o.Metrics)
		if err != nil {
			return err
		}
		defer l.Close()
		ml = l
	}
	link, err := netlink.LinkByName(o.Iface)
	if err != nil {
		return fmt.Errorf("vnat run: interface %s: %w", o.Iface, err)
	}
	pin, err := pinDir(o, log)
	if err != nil {
		return err
	}
	d, err := vnat.Open(vnat.Options{PinDir: pin})
	if err != nil {
		return err
	}
	// A stop on request (`onehop vnat stop`) removes the pins and every
	// translation; any other end of the daemon leaves them in force.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var remove atomic.Bool
	defer func() {
		if remove.Load() {
			if err := d.Remove(); err != nil {
				log.Error("vnat: remove datapath", "err", err)
			}
			log.Info("vnat daemon stopped on request: translations and pins removed", "pin_dir", pin)
			return
		}
		if err := d.Close(); err != nil {
			log.Error("vnat: close datapath", "err", err)
		}
		if pin != "" {
			log.Info("vnat daemon stopped: translations stay pinned for the next run", "pin_dir", pin)
		}
	}()
	if err := d.AttachInterface(o.Iface); err != nil {
		return err
	}
	// A connection preempted in a conflict (--conflict preempt) has its
	// socket closed (sock_diag SOCK_DESTROY); say now if this kernel
	// cannot, rather than at the first conflict.
	closePreempted := true
	if err := d.CanDestroySockets(); err != nil {
		closePreempted = false
		log.Warn("vnat: this kernel cannot close sockets: a connection preempted in a virtual-identification conflict keeps its socket until its own timers give up", "err", err)
	}
	if o.Cgroup != "" {
		if err := d.AttachCgroup(o.Cgroup); err != nil {
			return err
		}
	}
	var helpers []Helper
	if !o.NoKeepaliveHelper {
		helpers = append(helpers, keepalive{d: d})
	}
	if freezer != nil {
		helpers = append(helpers, freezer)
	}
	cfg := Config{LocationServers: servers, AllowUnkeyed: o.AllowUnkeyed, Logger: log, Helpers: helpers, Conflict: conflict, MaxAway: o.MaxAway}
	// The keys are kept with the pinned state: what a restart takes over
	// is what they authenticate. Unpinned, the translations end with the
	// daemon, and so do the keys.
	var keys *KeyFile
	if pin != "" {
		keys = &KeyFile{Path: o.KeyFile, PinDir: pin}
		if keys.Path == "" {
			keys.Path = KeyFilePath(pin)
		}
		cfg.Keys = keys
	}
	var metrics *Metrics
	listeners := accept.NewStats(nil)
	if ml != nil {
		metrics = NewMetrics(d.Counters)
		listeners = metrics.listeners
		cfg.OnRestore = metrics.ObserveRestore
	}
	e := New(cfg, newKernel(d, o.Iface), tcpDialer)
	if metrics != nil {
		metrics.Attach(e)
		if err := serveMetrics(ctx, ml, metrics, log); err != nil {
			return err
		}
		log.Info("vnat metrics", "addr", ml.Addr())
	}
	// Runs before the datapath closes: no application stays frozen.
	defer e.StopHelpers()
	// Stopped on request, the keys go with the pins (nothing will take
	// their connections over); ended otherwise, they stay for the next run.
	defer func() {
		if remove.Load() {
			if err := e.DropKeys(); err != nil {
				log.Error("vnat: remove the key file", "err", err)
			}
		}
	}()
	e.OnStop(func() { remove.Store(true); cancel() })
	if err := e.Sync(); err != nil {
		return err
	}
	if keys != nil {
		// Before anything talks VCMP: first contact would otherwise ask
		// the peers for new keys, which they refuse outside a suspension.
		es, err := keys.Load()
		if err != nil {
			return fmt.Errorf("vnat run: %w", err)
		}
		if len(es) > 0 {
			n, dropped := e.LoadKeys(es)
			log.Info("vnat: keys agreed before the restart kept", "key_file", keys.Path, "conns", n, "dropped_closed", dropped)
		}
	}

	listen := o.Listen
	if listen == "" {
		listen = "0.0.0.0:" + strconv.Itoa(vcmp.Port)
	}
	vl, err := net.Listen("tcp4", listen)
	if err != nil {
		return fmt.Errorf("vnat run: vcmp listener: %w", err)
	}
	defer vl.Close()
	ctl := o.Control
	if ctl == "" {
		if ctl, err = DefaultControl(); err != nil {
			return err
		}
	}
	cl, err := ListenControl(ctl)
	if err != nil {
		return fmt.Errorf("vnat run: %w", err)
	}
	defer cl.Close()
	go e.serveControl(ctx, cl, listeners, log) //nolint:errcheck // ends with ctx
	vcmpLimits := o.VCMP.Or(DefaultVCMPLimits)
	go serveVCMP(ctx, e, accept.Wrap(vl, accept.Options{Name: "vcmp", Limits: vcmpLimits, Log: log, Stats: listeners}), log)
	go contact(ctx, e, log)
	go keepLocations(ctx, e, servers, log)
	go expireAway(ctx, e)

	addr, err := primary(link.Attrs().Index)
	if err != nil {
		return err
	}
	log.Info("vnat daemon up", "iface", o.Iface, "addr", addr, "vcmp", listen, "control", ctl, "location_servers", servers, "allow_unkeyed", o.AllowUnkeyed,
		"keepalive_helper", !o.NoKeepaliveHelper, "freeze_cgroup", o.FreezeCgroup, "max_away", o.MaxAway, "pin_dir", pin, "key_file", keyPath(keys), "migrated", len(d.Migrations()),
		"conflict", conflict, "close_preempted", closePreempted,
		"max_conns", vcmpLimits.Total, "max_conns_per_source", vcmpLimits.PerSource, "idle_timeout", vcmpLimits.Idle)
	return watch(ctx, e, d, link.Attrs().Index, addr, log)
}

// PinRoot is where the daemons pin, one directory per network namespace.
const PinRoot = "/sys/fs/bpf/onehop/vnat"

// DefaultPinDir is the pin directory of the caller's network namespace
// (named by its inode, like the control socket).
func DefaultPinDir() (string, error) {
	ino, err := netnsInode()
	if err != nil {
		return "", err
	}
	return filepath.Join(PinRoot, fmt.Sprintf("netns-%d", ino)), nil
}

// pinDir decides where the daemon pins: nowhere with --no-pin; the
// default directory if it is on a bpffs (else nowhere, said in the log);
// --pin-dir, which must be on a bpffs.
func pinDir(o Options, log *slog.Logger) (string, error) {
	switch {
	case o.NoPin:
		return "", nil
	case o.PinDir != "":
		if !vnat.IsBPFFS(o.PinDir) {
			return "", fmt.Errorf("vnat run: --pin-dir %s is not on a bpffs (mount one there, or give --no-pin)", o.PinDir)
		}
		return o.PinDir, nil
	}
	p, err := DefaultPinDir()
	if err != nil {
		return "", err
	}
	if !vnat.IsBPFFS(p) {
		log.Warn("vnat: no bpffs at "+PinRoot+": running unpinned, translations end with the daemon (mount -t bpf bpf /sys/fs/bpf, or give --pin-dir)", "pin_dir", p)
		return "", nil
	}
	return p, nil
}

// contact looks for new connections every ContactEvery and agrees keys
// with their peers' daemons (first contact), so an unplanned move is
// authenticated too.
func contact(ctx context.Context, e *Engine, log *slog.Logger) {
	t := time.NewTicker(ContactEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := e.Sync(); err != nil {
			log.Error("vnat: list connections", "err", err)
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		if n, err := e.AgreeKeys(cctx); err != nil {
			// A peer without a VNAT daemon: asked once per connection.
			log.Debug("vnat: first-contact keys", "keyed", n, "err", err)
		}
		cancel()
	}
}

// ContactEvery is how often the daemon looks for new connections to key.
const ContactEvery = 2 * time.Second

// serveVCMP answers VCMP streams accepted on l until ctx ends. l waits
// out a flood (EMFILE and the like) and caps it; Accept fails only once l
// is closed or broken for good.
func serveVCMP(ctx context.Context, e *Engine, l *accept.Listener, log *slog.Logger) {
	go func() { <-ctx.Done(); l.Close() }()
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() == nil {
				log.Error("vnat: vcmp accept: no more VCMP served", "err", err)
			}
			return
		}
		go func() {
			defer c.Close()
			from := c.(*accept.Conn).Source()
			if err := e.Serve(c, from); err != nil {
				e.mu.Lock()
				e.warn("vcmp_stream_errors", "vnat: vcmp stream", "from", from, "err", err)
				e.mu.Unlock()
			}
		}()
	}
}

// primary is the interface's first IPv4 address (the invalid Addr if none).
func primary(ifindex int) (netip.Addr, error) {
	link, err := netlink.LinkByIndex(ifindex)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("vnat: interface %d: %w", ifindex, err)
	}
	as, err := netlink.AddrList(link, unix.AF_INET)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("vnat: addresses of %s: %w", link.Attrs().Name, err)
	}
	for _, a := range as {
		if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok {
			return ip, nil
		}
	}
	return netip.Addr{}, nil
}

// watch follows the interface's addresses (netlink subscription): when its
// address changes from one to another, the connections are restored.
func watch(ctx context.Context, e *Engine, d *vnat.Kernel, ifindex int, cur netip.Addr, log *slog.Logger) error {
	ch := make(chan netlink.AddrUpdate, 64)
	done := make(chan struct{})
	defer close(done)
	if err := netlink.AddrSubscribeWithOptions(ch, done, netlink.AddrSubscribeOptions{
		ErrorCallback: func(err error) { log.Error("vnat: address subscription", "err", err) },
	}); err != nil {
		return fmt.Errorf("vnat: subscribe to addresses: %w", err)
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case u, ok := <-ch:
			if !ok {
				return errors.New("vnat: address subscription ended")
			}
			if u.LinkIndex != ifindex {
				continue
			}
			seen := time.Now()
			now, err := primary(ifindex)
			if err != nil {
				log.Error("vnat: read address", "err", err)
				continue
			}
			if !now.IsValid() || now == cur {
				continue // between the old address leaving and the new one coming
			}
			old := cur
			cur = now
			if !old.IsValid() {
				continue
			}
			log.Info("vnat: address changed, restoring connections", "old", old, "new", now)
			// Removing an interface's last address flushed the routes to moved peers.
			if err := d.Resync(); err != nil {
				log.Error("vnat: resync routes", "err", err)
			}
			rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
			r, err := e.RestoreAndReport(rctx, old, now, seen)
			cancel()
			if err != nil {
				log.Error("vnat: restore", "old", old, "new", now, "err", err)
			}
			log.Info("vnat: restored", "took", r.Done.Sub(r.Seen), "conns", r.Conns, "migrated", r.Migrated, "aborted", r.Aborted)
		}
	}
}

// keyPath is where the keys are kept ("" when they are not).
func keyPath(k *KeyFile) string {
	if k == nil {
		return ""
	}
	return k.Path
}
