package controller

import (
	"fmt"
	"net/netip"
	"net/url"
	"os"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/onehop/onehop/internal/pki"
)

// EmbeddedEtcd starts a single-member etcd in dataDir, serving clients on
// clientURL (for agents over the fabric) and, without TLS, on a unix socket
// (for the operator's tools on the machine, whatever namespace they are
// in), plain and made 0600: only root on this machine may use it.
//
// With TLS files, clientURL is https://IP:PORT and every client must present
// a certificate the CA signed: the fabric is not trusted. Without them it is
// http://IP:PORT and open to anyone who reaches it (--insecure). With TLS
// etcd's own socket would be useless once the controller enables auth (a
// plain connection is no user), so socket must be empty: the daemon serves
// its socket itself (serveEtcdSocket).
//
// Its peer URL is loopback-only: the embedded member never has peers, so no
// peer traffic crosses the fabric; to grow, point every component at an
// external cluster with --etcd-endpoints.
func EmbeddedEtcd(dataDir, clientURL, socket, peerURL string, files pki.Files) (*embed.Etcd, error) {
	return EmbeddedEtcdWith(dataDir, clientURL, socket, peerURL, files, EtcdOptions{})
}

// CompactRetain is how many revisions of history the store keeps: etcd's
// auto-compaction on the embedded member, the controller's own compaction of
// an external cluster. An agent whose watch falls further behind than that
// relists; every other reader needs only the current values.
const CompactRetain = 10000

// EtcdOptions are the embedded member's settings beyond its URLs; the zero
// value is the default.
type EtcdOptions struct {
	// Quota is the database size beyond which etcd raises NOSPACE and
	// refuses writes; 0 is etcd's default, 2 GiB.
	Quota int64
	// Retain is how many revisions auto-compaction keeps; 0 is
	// CompactRetain.
	Retain int64
	// NoFsync skips fsync: for tests only, a crash may lose writes.
	NoFsync bool
}

// EmbeddedEtcdWith is EmbeddedEtcd with options: auto-compaction by
// revision keeping o.Retain revisions (etcd runs it every five minutes), and
// o.Quota.
func EmbeddedEtcdWith(dataDir, clientURL, socket, peerURL string, files pki.Files, o EtcdOptions) (*embed.Etcd, error) {
	scheme := "https"
	if files.Empty() {
		scheme = "http"
	}
	if socket != "" && !files.Empty() {
		return nil, fmt.Errorf("etcd socket %s with TLS: etcd's plain socket is no user once auth is on; serve it with serveEtcdSocket", socket)
	}
	cu, err := url.Parse(clientURL)
	if err != nil || cu.Scheme != scheme || cu.Port() == "" {
		return nil, fmt.Errorf("etcd client url %q: want %s://IP:PORT", clientURL, scheme)
	}
	cfg := embed.NewConfig()
	cfg.Name = "onehop"
	cfg.Dir = dataDir
	cfg.LogLevel = "error"
	// Errors only, each on one line: with auth on, every request of a
	// certificate that is no user (an agent of a host not yet added) is
	// an error etcd would otherwise log with a stack trace.
	zc := zap.NewProductionConfig()
	zc.Level = zap.NewAtomicLevelAt(zap.ErrorLevel)
	zc.DisableStacktrace = true
	lg, err := zc.Build()
	if err != nil {
		return nil, fmt.Errorf("etcd logger: %w", err)
	}
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(lg)
	if o.Retain <= 0 {
		o.Retain = CompactRetain
	}
	cfg.AutoCompactionMode = embed.CompactorModeRevision
	cfg.AutoCompactionRetention = fmt.Sprint(o.Retain)
	cfg.QuotaBackendBytes = o.Quota
	cfg.UnsafeNoFsync = o.NoFsync
	cfg.ListenClientUrls = []url.URL{*cu}
	if socket != "" {
		os.Remove(socket) // a socket left by a killed controller blocks the listen
		cfg.ListenClientUrls = append(cfg.ListenClientUrls, url.URL{Scheme: "unix", Path: socket})
	}
	cfg.AdvertiseClientUrls = []url.URL{*cu}
	if !files.Empty() {
		cfg.ClientTLSInfo.CertFile = files.Cert
		cfg.ClientTLSInfo.KeyFile = files.Key
		cfg.ClientTLSInfo.TrustedCAFile = files.CA
		cfg.ClientTLSInfo.ClientCertAuth = true
	}
	if peerURL == "" {
		peerURL = "http://127.0.0.1:2380"
	}
	pu, err := url.Parse(peerURL)
	if err != nil {
		return nil, fmt.Errorf("etcd peer url %q: %w", peerURL, err)
	}
	if ip, err := netip.ParseAddr(pu.Hostname()); err != nil || !ip.IsLoopback() {
		return nil, fmt.Errorf("etcd peer url %q: must be a loopback address (the embedded member has no peers)", peerURL)
	}
	peer := *pu
	cfg.ListenPeerUrls = []url.URL{peer}
	cfg.AdvertisePeerUrls = []url.URL{peer}
	cfg.InitialCluster = cfg.Name + "=" + peer.String()
	cfg.ListenMetricsUrls = nil
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("start embedded etcd in %s: %w", dataDir, err)
	}
	select {
	case <-e.Server.ReadyNotify():
		if socket != "" {
			if err := os.Chmod(socket, 0o600); err != nil {
				e.Close()
				return nil, fmt.Errorf("etcd socket %s: %w", socket, err)
			}
		}
		return e, nil
	case <-time.After(30 * time.Second):
		e.Close()
		return nil, fmt.Errorf("embedded etcd in %s not ready after 30s", dataDir)
	}
}
