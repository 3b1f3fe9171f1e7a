package vnatd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/internal/vcmp"
	"github.com/onehop/onehop/internal/vnat"
)

// Options are `onehop vnat run`'s flags.
type Options struct {
	Iface           string   // the endpoint's interface (eth0)
	LocationServers []string // host or host:port, or vcmp://host[:port]
	RequireKeys     bool
	Control         string // control socket; "" = DefaultControl()
	Cgroup          string // cgroup v2 to attach sockops to; "" = none (sock_diag only)
	Listen          string // VCMP listen address; "" = 0.0.0.0:2031
	Logger          *slog.Logger
}

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
	var servers []netip.Addr
	for _, s := range o.LocationServers {
		a, err := ParseServer(s)
		if err != nil {
			return err
		}
		servers = append(servers, a)
	}
	link, err := netlink.LinkByName(o.Iface)
	if err != nil {
		return fmt.Errorf("vnat run: interface %s: %w", o.Iface, err)
	}
	d, err := vnat.Open(vnat.Options{})
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.AttachInterface(o.Iface); err != nil {
		return err
	}
	if o.Cgroup != "" {
		if err := d.AttachCgroup(o.Cgroup); err != nil {
			return err
		}
	}
	e := New(Config{LocationServers: servers, RequireKeys: o.RequireKeys, Logger: log}, kernel{d: d, iface: o.Iface}, tcpDialer)
	if err := e.Sync(); err != nil {
		return err
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
	if err := os.MkdirAll(filepath.Dir(ctl), 0o755); err != nil {
		return fmt.Errorf("vnat run: control dir: %w", err)
	}
	if err := os.Remove(ctl); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("vnat run: stale control socket: %w", err)
	}
	cl, err := net.Listen("unix", ctl)
	if err != nil {
		return fmt.Errorf("vnat run: control socket: %w", err)
	}
	defer os.Remove(ctl)
	go e.ServeControl(ctx, cl) //nolint:errcheck // ends with ctx
	go serveVCMP(ctx, e, vl, log)
	go contact(ctx, e, log)

	addr, err := primary(link.Attrs().Index)
	if err != nil {
		return err
	}
	log.Info("vnat daemon up", "iface", o.Iface, "addr", addr, "vcmp", listen, "control", ctl, "location_servers", servers, "require_keys", o.RequireKeys)
	return watch(ctx, e, d, link.Attrs().Index, addr, log)
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

func serveVCMP(ctx context.Context, e *Engine, l net.Listener, log *slog.Logger) {
	go func() { <-ctx.Done(); l.Close() }()
	for {
		c, err := l.Accept()
		if err != nil {
			if ctx.Err() == nil {
				log.Error("vnat: vcmp accept", "err", err)
			}
			return
		}
		go func() {
			defer c.Close()
			from := netip.MustParseAddrPort(c.RemoteAddr().String()).Addr()
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
func watch(ctx context.Context, e *Engine, d *vnat.Datapath, ifindex int, cur netip.Addr, log *slog.Logger) error {
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
