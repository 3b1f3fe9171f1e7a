package vnatrelay

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/onehop/onehop/internal/feature"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/netns"
	"github.com/onehop/onehop/internal/netns/netnstest"
	"github.com/onehop/onehop/internal/pki/pkitest"
	"github.com/onehop/onehop/internal/testenv"
	"github.com/onehop/onehop/internal/vcmp"
)

// veth makes a veth pair: host in hostNS (the vif), eth0 in vmNS with addr
// and mac, up, with a static neighbour for Addr (the datapath's gateway
// hand-over is not here: the VM reaches the host directly).
func veth(t *testing.T, hostNS, vmNS, vif, addr string, mac net.HardwareAddr) {
	t.Helper()
	h, err := netns.Handle(hostNS)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	vmFd, err := netns.Fd(vmNS)
	if err != nil {
		t.Fatal(err)
	}
	defer vmFd.Close()
	la := netlink.NewLinkAttrs()
	la.Name = vif
	if err := h.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "eth0", PeerHardwareAddr: mac, PeerNamespace: netlink.NsFd(vmFd)}); err != nil {
		t.Fatalf("veth %s: %v", vif, err)
	}
	l, err := h.LinkByName(vif)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetUp(l); err != nil {
		t.Fatal(err)
	}
	v, err := netns.Handle(vmNS)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	eth, err := v.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	a, err := netlink.ParseAddr(addr + "/24")
	if err != nil {
		t.Fatal(err)
	}
	if err := v.AddrAdd(eth, a); err != nil {
		t.Fatal(err)
	}
	if err := v.LinkSetUp(eth); err != nil {
		t.Fatal(err)
	}
	if err := v.RouteAdd(&netlink.Route{LinkIndex: eth.Attrs().Index, Dst: &net.IPNet{IP: Addr.AsSlice(), Mask: net.CIDRMask(32, 32)}, Scope: netlink.SCOPE_LINK}); err != nil {
		t.Fatal(err)
	}
	if err := v.NeighSet(&netlink.Neigh{LinkIndex: eth.Attrs().Index, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT, IP: Addr.AsSlice(), HardwareAddr: l.Attrs().HardwareAddr}); err != nil {
		t.Fatal(err)
	}
}

// ask opens a VCMP stream from vmNS to the service and exchanges one query.
func ask(vmNS string) (vcmp.Message, error) {
	var ans vcmp.Message
	err := netns.Do(vmNS, func() error {
		c, err := net.DialTimeout("tcp4", netip.AddrPortFrom(Addr, vcmp.Port).String(), time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second)) //nolint:errcheck
		q := vcmp.Query(vcmp.Record{Conn: vcmp.Tuple{Proto: vcmp.TCP, Local: netip.MustParseAddrPort("10.1.1.2:40000"),
			Remote: netip.MustParseAddrPort("10.1.2.2:7100")}, Phys: netip.MustParseAddrPort("10.1.3.2:40000")})
		as, err := vcmp.Exchange(c, []vcmp.Message{q})
		if err != nil {
			return err
		}
		ans = as[0]
		return nil
	})
	return ans, err
}

// TestPrivilegedRelayCarriesAVMsStreamNamingItAndOnlyOnItsVif: a VM on a
// served vif reaches Addr:2031 and its stream arrives at the location
// server over TLS with the agent's certificate, after a VCMP_RELAY naming
// it, answered end to end; a VM on a vif
// the relay does not serve gets nothing (the listener is bound to the
// served vif); once its VM leaves the plan, the served vif is closed too.
func TestPrivilegedRelayCarriesAVMsStreamNamingItAndOnlyOnItsVif(t *testing.T) {
	testenv.RequireRoot(t, "namespaces, veths, neighbour entries")
	hostNS, vmNS, otherNS := netnstest.New(t, "locsrv-relay-h"), netnstest.New(t, "locsrv-relay-v"), netnstest.New(t, "locsrv-relay-o")
	vmMAC, _ := net.ParseMAC("02:00:0a:01:01:02")
	otherMAC, _ := net.ParseMAC("02:00:0a:01:01:03")
	veth(t, hostNS, vmNS, "locsrv-vif1", "10.1.1.2", vmMAC)
	veth(t, hostNS, otherNS, "locsrv-vif2", "10.1.1.3", otherMAC)
	// The host could answer the other VM (a route and its MAC): only the
	// listener's binding to the served vif keeps it out.
	h, err := netns.Handle(hostNS)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	vif2, err := h.LinkByName("locsrv-vif2")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.RouteAdd(&netlink.Route{LinkIndex: vif2.Attrs().Index, Dst: &net.IPNet{IP: net.IPv4(10, 1, 1, 3), Mask: net.CIDRMask(32, 32)}, Scope: netlink.SCOPE_LINK}); err != nil {
		t.Fatal(err)
	}
	if err := h.NeighSet(&netlink.Neigh{LinkIndex: vif2.Attrs().Index, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT, IP: net.IPv4(10, 1, 1, 3), HardwareAddr: otherMAC}); err != nil {
		t.Fatal(err)
	}

	// The location server: what arrives, on the agents' channel (TLS,
	// the agent's certificate required), and one answer per batch.
	p := pkitest.New(t)
	plain, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := tls.NewListener(plain, p.ServerConfig())
	defer srv.Close()
	relayed := make(chan netip.Addr, 16)
	go netnstest.Serve(srv, func(c net.Conn) {
		tc := c.(*tls.Conn)
		if err := tc.Handshake(); err != nil {
			t.Errorf("the relay's TLS handshake: %v", err)
			return
		}
		if cn := tc.ConnectionState().PeerCertificates[0].Subject.CommonName; cn != "h1" {
			t.Errorf("relayed with the certificate of %q, want the agent's, h1", cn)
			return
		}
		m, err := vcmp.ReadMessage(c)
		if err != nil {
			return
		}
		r, ok := m.(*vcmp.Relay)
		if !ok {
			return
		}
		relayed <- r.Source
		vcmp.ServeBatches(c, func(m vcmp.Message) vcmp.Message { //nolint:errcheck // the client checks the answer
			q := m.(*vcmp.LocQuery)
			return &vcmp.LocAnswer{Record: q.Record, Status: vcmp.LocStored}
		})
	})

	node := feature.Node{Desired: intent.Desired{Local: []intent.LocalEndpoint{{Name: "web1", IP: "10.1.1.2", MAC: vmMAC.String(), Interface: "locsrv-vif1"}}}}
	// Without the agent's certificate (an --insecure agent) it serves
	// no VM: the server would take no relay from it.
	if pl, err := New(netip.MustParseAddr("127.0.0.1"), slog.New(slog.NewTextHandler(io.Discard, nil))).Compile(node); err != nil || pl.InUse() {
		t.Fatalf("a relay without TLS: plan %+v, %v; want none", pl, err)
	}
	r := New(netip.MustParseAddr("127.0.0.1"), slog.New(slog.NewTextHandler(io.Discard, nil))).WithTLS(p.Agent("h1"))
	r.dial = func(ctx context.Context) (net.Conn, error) {
		d := tls.Dialer{Config: r.tls}
		return d.DialContext(ctx, "tcp4", srv.Addr().String())
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Run(ctx) //nolint:errcheck // returns nil when ctx ends
	sync := func(n feature.Node) {
		t.Helper()
		p, err := r.Compile(n)
		if err != nil {
			t.Fatal(err)
		}
		if err := netns.Do(hostNS, func() error { return r.Sync(p) }); err != nil {
			t.Fatalf("sync: %v", err)
		}
	}
	sync(node)
	sync(node) // a second pass changes nothing

	a, err := ask(vmNS)
	if err != nil {
		t.Fatalf("the served VM: %v", err)
	}
	if la, ok := a.(*vcmp.LocAnswer); !ok || la.Status != vcmp.LocStored {
		t.Fatalf("the served VM's answer: %#v", a)
	}
	select {
	case src := <-relayed:
		if src != netip.MustParseAddr("10.1.1.2") {
			t.Fatalf("relayed as %v, want 10.1.1.2", src)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("nothing relayed")
	}

	// The VM holds its MaxStreamsPerVM streams open and silent: one more
	// is closed at once and counted, and once it lets them go it is
	// served again. The asks above must have been given back first, or
	// one of them still counts against the VM.
	testenv.Eventually(t, "the asks' streams given back", 5*time.Second, func() bool { return r.listeners.Counters("vnat_relay")["open"] == 0 })
	var idle []net.Conn
	for range MaxStreamsPerVM + 1 {
		if err := netns.Do(vmNS, func() error {
			c, err := net.DialTimeout("tcp4", netip.AddrPortFrom(Addr, vcmp.Port).String(), time.Second)
			if err == nil {
				idle = append(idle, c)
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	over := idle[MaxStreamsPerVM]
	over.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := over.Read(make([]byte, 1)); n != 0 || err == nil || isTimeout(err) {
		t.Fatalf("stream %d of one VM: read %d, %v; want it closed by the relay", MaxStreamsPerVM+1, n, err)
	}
	if got := r.listeners.Counters("vnat_relay")["refused_per_source"]; got != 1 {
		t.Fatalf("refused_per_source %d, want 1", got)
	}
	for _, c := range idle {
		c.Close()
	}
	testenv.Eventually(t, "the idle streams given back", 5*time.Second, func() bool { return r.listeners.Counters("vnat_relay")["open"] == 0 })
	if _, err := ask(vmNS); err != nil {
		t.Fatalf("the VM after letting its streams go: %v", err)
	}
	for range MaxStreamsPerVM + 1 { // the held streams' and the last ask's
		select {
		case <-relayed:
		case <-time.After(5 * time.Second):
			t.Fatal("a held stream was not relayed")
		}
	}

	if _, err := ask(otherNS); err == nil {
		t.Fatal("a VM on a vif the relay does not serve reached the service")
	}
	// The VM leaves: its listener closes.
	sync(feature.Node{})
	if _, err := ask(vmNS); err == nil {
		t.Fatal("the VM reached the service after it left the plan")
	} else if !errors.Is(err, context.DeadlineExceeded) && !isTimeout(err) {
		t.Logf("after leaving: %v", err)
	}
	select {
	case src := <-relayed:
		t.Fatalf("relayed %v from a VM the relay does not serve", src)
	default:
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
