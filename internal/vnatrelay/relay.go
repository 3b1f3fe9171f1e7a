// Package vnatrelay is the host's side of the VNAT location service for
// VMs (docs/vnat-location.md): a VM lives in tenant space and reaches
// nothing outside it, yet its VNAT daemon must reach the location server,
// the controller, on the fabric. The datapath hands a VM's TCP to
// Addr:2031 to the host's stack (bpf/lib/vnat_service.h, when the feature's
// bit is set); here the agent listens on that address bound to each local
// VM's vif, and relays each stream to the controller's location server,
// prefixed by a VCMP_RELAY naming the VM, over TLS with the agent's own
// client certificate (CN = the node): the controller takes a relay only on
// that channel, and only from the host its intent places the VM on (a
// sliver shares the host's address, never its key). A VM reaches only this
// one service, and only through its own vif.
//
// It is an agent feature (internal/feature): Compile lists the local VMs
// from the node's desired state, Sync keeps one listener and one permanent
// neighbour entry per VM (the datapath drops a VM's ARP replies, so the host
// cannot learn the VM's MAC by asking), Run stops them at the end.
package vnatrelay

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/internal/accept"
	"github.com/onehop/onehop/internal/datapath"
	"github.com/onehop/onehop/internal/feature"
	"github.com/onehop/onehop/internal/ratelog"
	"github.com/onehop/onehop/internal/vcmp"
)

// Addr is the location service's address as every VM sees it: link-local,
// the same in every subnet (a VM that moves keeps its --location-server),
// reached through the VM's default gateway. "20.31" for port 2031.
var Addr = netip.MustParseAddr("169.254.20.31")

// StreamTimeout bounds one relayed stream (a locate or refresh is one round
// trip).
const StreamTimeout = 30 * time.Second

// MaxStreamsPerVM is how many streams one VM may have relayed at once.
const MaxStreamsPerVM = 4

// IdleTimeout ends a relayed stream on which nothing moved either way for
// this long (an exchange is one round trip; the daemon gives up on it
// after 10 s too).
const IdleTimeout = 10 * time.Second

// Limits bound each VM's listener: only its VM reaches it (bound to its
// vif), so the cap per source is the cap.
var Limits = accept.Limits{PerSource: MaxStreamsPerVM, Total: MaxStreamsPerVM, Idle: IdleTimeout}

// Relay is the feature.
type Relay struct {
	server netip.AddrPort // the controller's location server
	tls    *tls.Config    // the agent's channel to it (WithTLS); nil: no relay
	log    *slog.Logger
	rlog   *ratelog.Logger
	dial   func(ctx context.Context) (net.Conn, error)

	ctx    context.Context
	cancel context.CancelFunc

	// listeners counts every VM's listener as "vnat_relay" (WithListeners).
	listeners *accept.Stats

	mu      sync.Mutex
	vms     map[string]*vmRelay // by vif name
	loReady bool
}

type vmRelay struct {
	vm      VM
	ifindex int
	l       *accept.Listener
}

// New is the relay to the location server at server (an IPv4 address,
// port vcmp.Port); an invalid server makes a relay that is never in use.
func New(server netip.Addr, log *slog.Logger) *Relay {
	ctx, cancel := context.WithCancel(context.Background())
	r := &Relay{log: log, rlog: ratelog.New(log, 1, time.Second, nil), ctx: ctx, cancel: cancel, vms: map[string]*vmRelay{},
		listeners: accept.NewStats(nil)}
	if server.IsValid() {
		r.server = netip.AddrPortFrom(server, vcmp.Port)
	}
	r.dial = func(ctx context.Context) (net.Conn, error) {
		d := tls.Dialer{NetDialer: &net.Dialer{Timeout: 3 * time.Second}, Config: r.tls}
		return d.DialContext(ctx, "tcp4", r.server.String())
	}
	return r
}

// WithTLS relays over TLS with c: the agent's client certificate (CN = its
// node, signed by the cluster's CA) and the CA the controller's
// certificate is verified with. The location server takes relays on no
// other channel, so without it (nil: an --insecure agent) the relay serves
// no VM. Call it before the first Sync.
func (r *Relay) WithTLS(c *tls.Config) *Relay {
	if c != nil {
		c = c.Clone()
		// The server is dialled by address: its certificate must name it.
		c.ServerName = r.server.Addr().String()
		c.ClientSessionCache = tls.NewLRUClientSessionCache(0)
	}
	r.tls = c
	return r
}

// Name implements feature.Feature.
func (*Relay) Name() string { return "vnat-location" }

// Bit implements feature.Feature: FEATURE_VNAT_LOCATION in the C.
func (*Relay) Bit() uint32 { return datapath.FeatureVNATLocation }

// Maps implements feature.Feature: the relay writes no map.
func (*Relay) Maps() []feature.Map { return nil }

// VM is one local VM the relay serves.
type VM struct {
	Vif string
	IP  netip.Addr
	MAC net.HardwareAddr
}

// Plan is the VMs to serve.
type Plan struct{ VMs []VM }

// Sizes implements feature.Plan: no map entries.
func (Plan) Sizes() feature.Sizes { return feature.Sizes{} }

// InUse implements feature.Plan: the datapath hands VMs' streams to the
// host only while the relay serves some VM.
func (p Plan) InUse() bool { return len(p.VMs) > 0 }

// Compile implements feature.Feature: every local VM of the node, if a
// location server is configured and the agent has its certificate to
// relay with (WithTLS).
func (r *Relay) Compile(n feature.Node) (feature.Plan, error) {
	if !r.server.IsValid() || r.tls == nil {
		return Plan{}, nil
	}
	var p Plan
	for _, l := range n.Desired.Local {
		ip, err := netip.ParseAddr(l.IP)
		if err != nil || !ip.Is4() {
			return nil, fmt.Errorf("vm %s: address %q is not IPv4", l.Name, l.IP)
		}
		mac, err := net.ParseMAC(l.MAC)
		if err != nil {
			return nil, fmt.Errorf("vm %s: mac %q: %w", l.Name, l.MAC, err)
		}
		if l.Interface == "" {
			return nil, fmt.Errorf("vm %s: no interface", l.Name)
		}
		p.VMs = append(p.VMs, VM{Vif: l.Interface, IP: ip, MAC: mac})
	}
	sort.Slice(p.VMs, func(i, j int) bool { return p.VMs[i].Vif < p.VMs[j].Vif })
	return p, nil
}

// Sync implements feature.Feature: one listener and one neighbour entry per
// VM whose vif is on this host now; a VM whose vif is not here yet (a move
// under way) is served from the pass that finds it.
func (r *Relay) Sync(fp feature.Plan) error {
	p, ok := fp.(Plan)
	if !ok {
		return fmt.Errorf("vnat-location: plan of type %T", fp)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ctx.Err() != nil {
		return nil
	}
	var errs []error
	if len(p.VMs) > 0 && !r.loReady {
		if err := serviceAddress(); err != nil {
			return err
		}
		r.loReady = true
	}
	want := map[string]VM{}
	for _, vm := range p.VMs {
		want[vm.Vif] = vm
	}
	for vif, v := range r.vms {
		link, err := netlink.LinkByName(vif)
		w, keep := want[vif]
		if keep && err == nil && link.Attrs().Index == v.ifindex && w.IP == v.vm.IP && w.MAC.String() == v.vm.MAC.String() {
			continue
		}
		v.l.Close()
		delete(r.vms, vif)
		if err == nil && link.Attrs().Index == v.ifindex {
			// Still here with another address: its old entry goes.
			n := &netlink.Neigh{LinkIndex: v.ifindex, Family: unix.AF_INET, IP: v.vm.IP.AsSlice()}
			if derr := netlink.NeighDel(n); derr != nil && !errors.Is(derr, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("vnat-location: forget neighbour %s on %s: %w", v.vm.IP, vif, derr))
			}
		}
	}
	if len(want) == 0 {
		// Nothing to serve: the host's neighbour table is not worth
		// reading on every pass (no location server, or no VM here).
		return errors.Join(errs...)
	}
	neighs, err := netlink.NeighList(0, unix.AF_INET)
	if err != nil {
		return fmt.Errorf("vnat-location: list neighbours: %w", err)
	}
	have := map[string]bool{}
	for _, n := range neighs {
		if n.State&netlink.NUD_PERMANENT != 0 && n.IP != nil {
			have[fmt.Sprintf("%d/%s/%s", n.LinkIndex, n.IP, n.HardwareAddr)] = true
		}
	}
	for vif, vm := range want {
		link, err := netlink.LinkByName(vif)
		if err != nil {
			continue // not on this host yet
		}
		idx := link.Attrs().Index
		if !have[fmt.Sprintf("%d/%s/%s", idx, vm.IP, vm.MAC)] {
			n := &netlink.Neigh{LinkIndex: idx, Family: unix.AF_INET, State: netlink.NUD_PERMANENT, IP: vm.IP.AsSlice(), HardwareAddr: vm.MAC}
			if err := netlink.NeighSet(n); err != nil {
				errs = append(errs, fmt.Errorf("vnat-location: neighbour %s on %s: %w", vm.IP, vif, err))
				continue
			}
		}
		if _, ok := r.vms[vif]; ok {
			continue
		}
		l, err := listenOn(r.ctx, vif)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		al := accept.Wrap(l, accept.Options{Name: "vnat_relay", Limits: Limits, Log: r.log, Stats: r.listeners})
		v := &vmRelay{vm: vm, ifindex: idx, l: al}
		r.vms[vif] = v
		go r.serve(v)
	}
	return errors.Join(errs...)
}

// WithListeners counts the VMs' listeners in s (the agent's, exported on
// its /metrics) as "vnat_relay"; nil keeps the relay's own. Call it before
// the first Sync.
func (r *Relay) WithListeners(s *accept.Stats) *Relay {
	if s != nil {
		r.listeners = s
	}
	return r
}

// Run implements feature.Runner: it stops every listener when ctx ends.
func (r *Relay) Run(ctx context.Context) error {
	<-ctx.Done()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cancel()
	for vif, v := range r.vms {
		v.l.Close()
		delete(r.vms, vif)
	}
	return nil
}

// serviceAddress puts Addr on lo, scope host: the host's stack takes what
// the datapath hands it for Addr as its own.
func serviceAddress() error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("vnat-location: lo: %w", err)
	}
	a := &netlink.Addr{IPNet: &net.IPNet{IP: Addr.AsSlice(), Mask: net.CIDRMask(32, 32)}, Scope: int(netlink.SCOPE_HOST)}
	if err := netlink.AddrReplace(lo, a); err != nil {
		return fmt.Errorf("vnat-location: %s on lo: %w", Addr, err)
	}
	return nil
}

// listenOn listens on Addr:2031 bound to vif: only what arrives on that vif
// (from its VM) reaches the listener, and its answers leave by it with no
// route to the tenant space on the host (a socket bound to a device sends
// on-link there).
func listenOn(ctx context.Context, vif string) (net.Listener, error) {
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptString(int(fd), unix.SOL_SOCKET, unix.SO_BINDTODEVICE, vif)
		}); err != nil {
			return err
		}
		return serr
	}}
	l, err := lc.Listen(ctx, "tcp4", netip.AddrPortFrom(Addr, vcmp.Port).String())
	if err != nil {
		return nil, fmt.Errorf("vnat-location: listen on %s: %w", vif, err)
	}
	return l, nil
}

func (r *Relay) serve(v *vmRelay) {
	for {
		c, err := v.l.Accept()
		if err != nil {
			return // closed: the VM left, or the agent stops
		}
		from, err := netip.ParseAddrPort(c.RemoteAddr().String())
		if err != nil || from.Addr().Unmap() != v.vm.IP {
			// The datapath checked the source already: never expected.
			r.rlog.Warn("source", "vnat-location: stream from another address than the vif's VM", "vif", v.vm.Vif, "from", c.RemoteAddr().String(), "vm", v.vm.IP)
			c.Close()
			continue
		}
		go func() {
			if err := r.relay(c, v.vm.IP); err != nil {
				r.rlog.Info("relay", "vnat-location: relay", "vm", v.vm.IP, "err", err)
			}
		}()
	}
}

// relay carries one VM stream to the location server, after a VCMP_RELAY
// naming the VM.
func (r *Relay) relay(c net.Conn, vm netip.Addr) error {
	defer c.Close()
	ctx, cancel := context.WithTimeout(r.ctx, StreamTimeout)
	defer cancel()
	up, err := r.dial(ctx)
	if err != nil {
		return fmt.Errorf("dial location server %s: %w", r.server, err)
	}
	defer up.Close()
	deadline := time.Now().Add(StreamTimeout)
	c.SetDeadline(deadline)  //nolint:errcheck // TCP conns take deadlines
	up.SetDeadline(deadline) //nolint:errcheck
	stop := context.AfterFunc(ctx, func() { c.Close(); up.Close() })
	defer stop()
	if err := vcmp.WriteMessage(up, &vcmp.Relay{Source: vm}); err != nil {
		return err
	}
	done := make(chan error, 2)
	go func() { _, err := io.Copy(up, c); closeWrite(up); done <- err }()
	go func() { _, err := io.Copy(c, up); closeWrite(c); done <- err }()
	err = <-done
	if err2 := <-done; err == nil {
		err = err2
	}
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// closeWrite half-closes a stream (TCP, or TLS: its close_notify): the
// other side reads EOF after the last answer, as a direct stream would end.
func closeWrite(c net.Conn) {
	if t, ok := c.(interface{ CloseWrite() error }); ok {
		t.CloseWrite() //nolint:errcheck // the stream is ending anyway
	}
}
