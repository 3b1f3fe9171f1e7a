package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/vishvananda/netlink"

	"github.com/onehop/onehop/internal/datapath"
	"github.com/onehop/onehop/internal/store"
)

// DaemonConfig is the `onehop agent` command's configuration.
type DaemonConfig struct {
	Config
	EtcdEndpoints []string
	BPFFS         string // a mounted bpffs; the agent pins under BPFFS/NODE
	MetricsAddr   string
	DNS           []netip.Addr // handed to VMs by DHCP; none if empty
}

// Validate reports the first configuration mistake.
func (c DaemonConfig) Validate() error {
	switch {
	case c.Node == "":
		return errors.New("--node is required: the host name as in the topology")
	case len(c.EtcdEndpoints) == 0:
		return errors.New("--etcd-endpoints is required")
	case c.BPFFS == "":
		return errors.New("--bpffs is required: a directory for pinned maps and links")
	}
	return nil
}

// RunDaemon runs the agent until ctx ends. Pinned maps and links outlive it:
// stopping the agent does not stop traffic.
func RunDaemon(ctx context.Context, cfg DaemonConfig, mount func(string) error, log *slog.Logger) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if err := mount(cfg.BPFFS); err != nil {
		return err
	}
	k, err := datapath.Open(filepath.Join(cfg.BPFFS, cfg.Node))
	if err != nil {
		return err
	}
	defer k.Close()
	s, err := store.DialEtcd(cfg.EtcdEndpoints)
	if err != nil {
		return err
	}
	defer s.Close()
	a, err := New(cfg.Config, s, k, LinkTable{}, log)
	if err != nil {
		return err
	}

	events, err := k.DropEvents()
	if err != nil {
		return fmt.Errorf("open drop events: %w", err)
	}
	defer events.Close()
	go LogDrops(events, k.DropReason, ifname, log, 20)

	slow, err := k.SlowPath()
	if err != nil {
		return fmt.Errorf("open slow path: %w", err)
	}
	defer slow.Close()
	dhcpd := &DHCPServer{DNS: cfg.DNS, Local: a.Local}
	go ServeSlowPath(slow, dhcpd, log)

	if cfg.MetricsAddr != "" {
		reg := prometheus.NewRegistry()
		reg.MustRegister(NewCollector(a))
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		ln, err := net.Listen("tcp", cfg.MetricsAddr)
		if err != nil {
			return fmt.Errorf("metrics listener %s: %w", cfg.MetricsAddr, err)
		}
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go srv.Serve(ln)
		defer srv.Close()
		log.Info("serving metrics", "addr", ln.Addr().String()+"/metrics")
	}
	return a.Run(ctx)
}

func ifname(ifindex int) string {
	if l, err := netlink.LinkByIndex(ifindex); err == nil {
		return l.Attrs().Name
	}
	return fmt.Sprintf("ifindex %d", ifindex)
}

// LinkTable looks interfaces up in the agent's own namespace.
type LinkTable struct{}

// ByName implements Interfaces.
func (LinkTable) ByName(name string) (int, net.HardwareAddr, string, error) {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return 0, nil, "", fmt.Errorf("interface %s: %w", name, err)
	}
	ip := ""
	if addrs, err := netlink.AddrList(l, netlink.FAMILY_V4); err == nil && len(addrs) > 0 {
		ip = addrs[0].IP.String()
	}
	return l.Attrs().Index, l.Attrs().HardwareAddr, ip, nil
}
