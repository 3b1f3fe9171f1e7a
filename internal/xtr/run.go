package xtr

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/internal/lisp"
	"github.com/onehop/onehop/internal/lispdp"
	"github.com/onehop/onehop/internal/opsport"
	"github.com/onehop/onehop/internal/ratelog"
)

// Run makes this network namespace the site's xTR until ctx ends: the LISP
// data plane on every RLOC and EID interface, the registration refreshed
// every RegisterInterval, and the mappings of remote EIDs installed as
// their connections arrive. It removes the data plane when it returns.
func Run(ctx context.Context, cfg *Config, log *slog.Logger) error {
	if cfg.MapResolver == (netip.AddrPort{}) {
		cfg.MapResolver = cfg.MapServer
	}
	var ops net.Listener
	if cfg.MetricsAddr != "" {
		// First: a bad or taken address fails before anything is set up.
		l, err := opsport.Listen("--metrics-addr", cfg.MetricsAddr)
		if err != nil {
			return fmt.Errorf("xtr: %w", err)
		}
		defer l.Close()
		ops = l
	}
	/* decapsulated packets are routed to the site, and a reply may leave
	   by another path than its request came in on (docs/lisp-datapath.md) */
	sysctls := map[string]string{"ipv4/ip_forward": "1", "ipv4/conf/all/rp_filter": "0", "ipv4/conf/default/rp_filter": "0"}
	links := make([]netlink.Link, len(cfg.RLOCs))
	addrs := make([]netip.Addr, len(cfg.RLOCs))
	for i, r := range cfg.RLOCs {
		l, err := netlink.LinkByName(r.Dev)
		if err != nil {
			return fmt.Errorf("--rloc %s: %w", r.Dev, err)
		}
		links[i], addrs[i] = l, r.Addr
		if !addrs[i].IsValid() {
			if addrs[i], err = firstIPv4(l); err != nil {
				return fmt.Errorf("--rloc %s: %w", r.Dev, err)
			}
		}
		sysctls["ipv4/conf/"+r.Dev+"/rp_filter"] = "0"
	}
	for k, v := range sysctls {
		if err := os.WriteFile("/proc/sys/net/"+k, []byte(v), 0o644); err != nil {
			return fmt.Errorf("xtr: sysctl net/%s=%s: %w", k, v, err)
		}
	}
	dp, err := lispdp.Open(lispdp.Options{})
	if err != nil {
		return fmt.Errorf("xtr: %w", err)
	}
	defer dp.Close()
	for _, r := range cfg.RLOCs {
		if err := dp.AttachRLOCWith(r.Dev, lispdp.RLOCOptions{WholeSuperpackets: cfg.WholeSuperpackets}); err != nil {
			return fmt.Errorf("--rloc %s: %w", r.Dev, err)
		}
	}
	for _, d := range cfg.EIDDevs {
		if err := dp.AttachEIDWith(d, lispdp.EIDOptions{WholeSuperpackets: cfg.SiteWholeSuperpackets}); err != nil {
			return fmt.Errorf("--eid-dev %s: %w", d, err)
		}
	}
	x := &xtr{cfg: cfg, log: log, dp: dp, links: links, addrs: addrs, res: lisp.NewResolver(cfg.MapResolver),
		warn: ratelog.New(log, 5, time.Minute, nil)}
	if x.raw, err = openRaw(); err != nil {
		return fmt.Errorf("xtr: %w", err)
	}
	defer unix.Close(x.raw.fd)
	seen := make(chan Syn, 256)
	for i, r := range cfg.RLOCs {
		fd, err := synSocket(links[i].Attrs().Index)
		if err != nil {
			return fmt.Errorf("--rloc %s: %w", r.Dev, err)
		}
		go x.sniff(ctx, fd, addrs[i], seen)
	}
	/* RLOC probes (RFC 9301 §7.1) arrive at each locator on the control
	   port; one socket per locator, so each answer leaves from the address
	   that was probed */
	x.probes = NewResponder(cfg.Records(addrs), nil)
	for i, a := range addrs {
		pc, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(a, lisp.ControlPort)))
		if err != nil {
			return fmt.Errorf("--rloc %s: answering RLOC probes on %s: %w", cfg.RLOCs[i].Dev, a, err)
		}
		go func() { <-ctx.Done(); pc.Close() }()
		go ServeProbes(pc, a, x.probes, x.warn)
	}
	reg := &lisp.Registrar{Server: cfg.MapServer, KeyID: cfg.KeyID, Key: cfg.Key, Records: cfg.Records(addrs),
		Interval: cfg.RegisterInterval, WantMapNotify: true, Log: log}
	for _, rec := range reg.Records {
		log.Info("xtr: registering", "eid", rec.EID, "rlocs", fmt.Sprint(addrs), "map_server", cfg.MapServer, "ttl", rec.TTL)
	}
	if ops != nil {
		src := x.sources(reg)
		r := prometheus.NewRegistry()
		r.MustRegister(NewMetrics(src))
		opsport.Serve(ctx, ops, opsport.Config{Daemon: "xtr", Gatherer: r, Ready: src.Ready, Log: log})
	}
	regDone := make(chan error, 1)
	go func() { regDone <- reg.Run(ctx) }()
	log.Info("xtr: running", "rlocs", len(cfg.RLOCs), "eid_devs", cfg.EIDDevs, "map_resolver", cfg.MapResolver)
	x.loop(ctx, seen)
	<-regDone
	return nil
}

// xtr is one running tunnel router.
type xtr struct {
	cfg      *Config
	log      *slog.Logger
	warn     *ratelog.Logger
	dp       *lispdp.Kernel
	links    []netlink.Link
	addrs    []netip.Addr
	res      *lisp.Resolver
	cache    Cache
	tunnels  Tunnels
	raw      rawSender
	replayed atomic.Uint64
	probes   *Responder
	// mapped is the cache's installed mappings as the loop last left it;
	// resolves counts map-requests by outcome (metrics.go).
	mapped   atomic.Int64
	resolves [3]atomic.Uint64 // installed, negative, failed
}

// The outcomes of a map-request, as resolves indexes them.
const (
	resolveInstalled = iota
	resolveNegative
	resolveFailed
)

// sources are what the xTR's metrics read.
func (x *xtr) sources(reg *lisp.Registrar) Sources {
	return Sources{Datapath: x.dp.Counters, Probes: x.probes.Stats, Registrar: reg.Stats,
		Mappings: func() int { return int(x.mapped.Load()) },
		Resolves: func() map[string]uint64 {
			return map[string]uint64{"installed": x.resolves[resolveInstalled].Load(),
				"negative": x.resolves[resolveNegative].Load(), "failed": x.resolves[resolveFailed].Load()}
		},
		Replayed: x.replayed.Load}
}

// ServeProbes answers with r the RLOC probes arriving on pc, the socket on
// locator local's control port, until pc is closed; warn rate-limits its
// complaints.
func ServeProbes(pc *net.UDPConn, local netip.Addr, r *Responder, warn *ratelog.Logger) {
	buf := make([]byte, lisp.MaxMessageLen+1)
	for {
		n, src, err := pc.ReadFromUDPAddrPort(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			warn.Warn("xtr: read rloc probes", "xtr: read rloc probes", "rloc", local, "err", err)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		src = netip.AddrPortFrom(src.Addr().Unmap(), src.Port())
		if out := r.Answer(buf[:n], src, local); out != nil {
			if _, err := pc.WriteToUDPAddrPort(out, src); err != nil {
				warn.Warn("xtr: answer an rloc probe", "xtr: answer an rloc probe", "rloc", local, "to", src, "err", err)
			}
		}
	}
}

// rawSender sends whole IPv4 packets, headers as given (IPPROTO_RAW).
type rawSender struct{ fd int }

func openRaw() (rawSender, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
	if err != nil {
		return rawSender{}, fmt.Errorf("raw socket: %w", err)
	}
	return rawSender{fd: fd}, nil
}

func (r rawSender) send(pkt []byte) error {
	if len(pkt) < 20 {
		return fmt.Errorf("packet of %d bytes", len(pkt))
	}
	return unix.Sendto(r.fd, pkt, 0, &unix.SockaddrInet4{Addr: [4]byte(pkt[16:20])})
}

// loop resolves what the sniffers saw and what came due, until ctx ends.
func (x *xtr) loop(ctx context.Context, seen <-chan Syn) {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		wait := time.Hour
		if next := x.cache.Next(); !next.IsZero() {
			wait = max(time.Until(next), 0)
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case syn := <-seen:
			if x.cache.Seen(syn.EID, time.Now()) && x.resolve(ctx, syn.EID) {
				x.replay(syn)
			}
		case <-timer.C:
			for _, eid := range x.cache.Due(time.Now()) {
				x.resolve(ctx, eid)
			}
		}
		x.mapped.Store(int64(x.cache.Installed()))
	}
}

// resolve asks the map-resolver about eid and installs the answer; it
// reports whether a mapping for eid is installed.
func (x *xtr) resolve(ctx context.Context, eid netip.Addr) bool {
	rec, err := x.res.Resolve(ctx, eid)
	if err != nil {
		if ctx.Err() == nil {
			x.warn.Warn("xtr: map-request failed; asking again later", "xtr: map-request failed; asking again later", "eid", eid, "err", err)
		}
		x.cache.Failed(eid, time.Now())
		x.resolves[resolveFailed].Add(1)
		return false
	}
	if rec.Negative() {
		x.resolves[resolveNegative].Add(1)
	}
	choices := Plan(rec, x.findRLOC)
	var pcs []lispdp.PathChoice
	for _, c := range choices {
		id, isNew, ok := x.tunnels.ID(c.Tunnel)
		if !ok {
			x.warn.Warn("xtr: every datapath path is in use", "xtr: every datapath path is in use", "eid", rec.EID, "remote", c.Remote)
			continue
		}
		if isNew {
			l := x.links[c.RLOC]
			p := lispdp.Path{Ifindex: l.Attrs().Index, LocalRLOC: x.addrs[c.RLOC], RemoteRLOC: c.Remote, MTU: l.Attrs().MTU}
			if err := x.dp.SetPath(id, p); err != nil {
				x.warn.Warn("xtr: set path", "xtr: set path", "id", id, "err", err)
				continue
			}
		}
		pcs = append(pcs, lispdp.PathChoice{ID: id, Priority: c.Priority, Weight: c.Weight})
	}
	if len(pcs) == 0 {
		choices = nil
	}
	if remove := x.cache.Resolved(eid, rec, choices, time.Now()); remove.IsValid() {
		if err := x.dp.DeleteEID(remove); err != nil {
			x.warn.Warn("xtr: delete mapping", "xtr: delete mapping", "eid", remove, "err", err)
		}
		x.log.Info("xtr: mapping removed", "eid", remove, "negative", rec.Negative())
	}
	if len(pcs) == 0 {
		if !rec.Negative() {
			x.warn.Warn("xtr: no RLOC of this xTR reaches any usable locator", "xtr: no RLOC of this xTR reaches any usable locator", "eid", rec.EID, "locators", len(rec.Locators))
		}
		return false
	}
	if err := x.dp.SetEID(rec.EID, pcs); err != nil {
		x.warn.Warn("xtr: install mapping", "xtr: install mapping", "eid", rec.EID, "err", err)
		x.cache.Failed(eid, time.Now())
		return false
	}
	var via []string
	for _, c := range choices {
		via = append(via, fmt.Sprintf("%s->%s", x.cfg.RLOCs[c.RLOC].Dev, c.Remote))
	}
	x.resolves[resolveInstalled].Add(1)
	x.log.Info("xtr: mapping installed", "seen", eid, "eid", rec.EID, "ttl", rec.TTL, "via", fmt.Sprint(via))
	return true
}

// replay hands the site the SYN that made the xTR resolve its EID once
// more, now that the mapping is installed, so the connection does not wait
// a second for a retransmission. Before the mapping, the first copy was
// dropped at decapsulation: the gateway's RLOC was no path yet
// (drop_unknown_rloc), or no mapping put the EID behind it
// (drop_source_eid). The copy replayed goes straight to the site; were the
// first one answered after all (a lost race), a SYN repeated for a pending
// connection makes the server send its SYN-ACK again at once (Linux:
// tcp_check_req).
func (x *xtr) replay(s Syn) {
	FixTCPChecksum(s.Inner)
	if err := x.raw.send(s.Inner); err != nil {
		x.warn.Warn("xtr: replay SYN", "xtr: replay SYN", "eid", s.EID, "err", err)
		return
	}
	x.replayed.Add(1)
	x.log.Info("xtr: first SYN handed to the site again", "eid", s.EID, "replayed", x.replayed.Load())
}

// findRLOC says which RLOC interface reaches locator loc (by the routes).
func (x *xtr) findRLOC(loc netip.Addr) (int, bool) {
	rs, err := netlink.RouteGet(loc.AsSlice())
	if err != nil || len(rs) == 0 {
		return 0, false
	}
	for i, l := range x.links {
		if rs[0].LinkIndex == l.Attrs().Index {
			return i, true
		}
	}
	return 0, false
}

// sniff reads the SYNs socket fd passes and reports each one's inner
// source, until ctx ends.
func (x *xtr) sniff(ctx context.Context, fd int, local netip.Addr, seen chan<- Syn) {
	defer unix.Close(fd)
	buf := make([]byte, 256)
	for ctx.Err() == nil {
		n, from, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				continue
			}
			x.warn.Warn("xtr: read SYNs", "xtr: read SYNs", "err", err)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
			continue
		}
		syn, ok := SynOf(buf[:n])
		if !ok || syn.OuterDst != local {
			continue
		}
		select {
		case seen <- syn:
		default: // the loop is busy: the next SYN (a retransmission) asks again
		}
	}
}

// synFilter passes what SynOf reads: IPv4, not a fragment, UDP to 4341,
// inner IPv4 TCP with SYN set (classic BPF, offsets from the Ethernet
// header; X holds the outer header length, then outer + inner).
var synFilter = []unix.SockFilter{
	{Code: 0x28, K: 12},                 // 0: ldh [12]
	{Code: 0x15, Jf: 17, K: 0x0800},     // 1: jeq IPv4 else drop
	{Code: 0x30, K: 23},                 // 2: ldb [23] (protocol)
	{Code: 0x15, Jf: 15, K: 17},         // 3: jeq UDP else drop
	{Code: 0x28, K: 20},                 // 4: ldh [20] (fragment)
	{Code: 0x45, Jt: 13, K: 0x1fff},     // 5: jset offset: drop
	{Code: 0xb1, K: 14},                 // 6: ldxb 4*([14]&0xf)
	{Code: 0x48, K: 16},                 // 7: ldh [x+16] (UDP destination)
	{Code: 0x15, Jf: 10, K: 4341},       // 8: jeq 4341 else drop
	{Code: 0x50, K: 39},                 // 9: ldb [x+39] (inner protocol)
	{Code: 0x15, Jf: 8, K: 6},           // 10: jeq TCP else drop
	{Code: 0x50, K: 30},                 // 11: ldb [x+30] (inner version, IHL)
	{Code: 0x54, K: 0x0f},               // 12: and 0xf
	{Code: 0x64, K: 2},                  // 13: lsh 2
	{Code: 0x0c},                        // 14: add x
	{Code: 0x07},                        // 15: tax
	{Code: 0x50, K: 43},                 // 16: ldb [x+43] (TCP flags)
	{Code: 0x45, Jt: 0, Jf: 1, K: 0x02}, // 17: jset SYN
	{Code: 0x06, K: 256},                // 18: accept 256 bytes
	{Code: 0x06, K: 0},                  // 19: drop
}

// synSocket opens a packet socket on ifindex that receives only the
// encapsulated SYNs (before the datapath decapsulates them: packet taps
// run ahead of tc ingress).
func synSocket(ifindex int) (int, error) {
	proto := int(htons(unix.ETH_P_IP))
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
	if err != nil {
		return -1, fmt.Errorf("packet socket: %w", err)
	}
	prog := unix.SockFprog{Len: uint16(len(synFilter)), Filter: &synFilter[0]}
	if err := unix.SetsockoptSockFprog(fd, unix.SOL_SOCKET, unix.SO_ATTACH_FILTER, &prog); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("attach SYN filter: %w", err)
	}
	tv := unix.Timeval{Usec: 200000} // so the reader sees ctx end
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(fd)
		return -1, err
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_IP), Ifindex: ifindex}); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("bind packet socket: %w", err)
	}
	return fd, nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

func firstIPv4(l netlink.Link) (netip.Addr, error) {
	as, err := netlink.AddrList(l, unix.AF_INET)
	if err != nil {
		return netip.Addr{}, err
	}
	for _, a := range as {
		if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok {
			return ip, nil
		}
	}
	return netip.Addr{}, fmt.Errorf("no IPv4 address (give addr=)")
}
