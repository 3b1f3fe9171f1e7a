package controller

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/onehop/onehop/internal/accept"
	"github.com/onehop/onehop/internal/addrplan"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/opsport"
	"github.com/onehop/onehop/internal/pki"
	"github.com/onehop/onehop/internal/sdnotify"
	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/topology"
)

// DaemonConfig is the `onehop controller` command's configuration.
type DaemonConfig struct {
	DataDir       string   // embedded etcd's data
	ClientURL     string   // where the embedded etcd serves agents
	Socket        string   // unix socket the embedded etcd also serves
	PeerURL       string   // embedded etcd's (loopback) peer URL; default http://127.0.0.1:2380
	EtcdEndpoints []string // an external cluster instead of the embedded one
	Topology      string   // topology file to seed an empty store with, optional
	APISocket     string   // unix socket the REST API is served on, optional
	APIListen     string   // TCP address the REST API is served on, optional
	// TLS names the CA, certificate and key the controller serves etcd's
	// client URL and the TCP API with, and dials etcd with: the
	// certificate needs both server and client usage.
	TLS pki.Files
	// APITokenFile holds a bearer token the TCP API accepts besides client
	// certificates; without it only client certificates get in.
	APITokenFile string
	// Insecure serves and dials plain TCP with no client authentication.
	Insecure bool
	// LISPListen is the UDP address of the LISP map-server/map-resolver
	// (lisp_server.go), e.g. the fabric address and port 4342; empty: none.
	LISPListen string
	// LISPSiteKeys is the file of sites allowed to register (lisp.ParseSites).
	LISPSiteKeys string
	// LocationListen is where the VNAT location server answers VCMP
	// (host:port, TCP; the paper's port is 2031); empty serves none.
	LocationListen string
	// EtcdQuota is the embedded etcd's database quota in bytes (0: etcd's
	// 2 GiB).
	EtcdQuota int64
	// MaintainEvery is how often the controller measures, compacts (an
	// external cluster) and defragments the store; 0 is 30 s.
	MaintainEvery time.Duration
	// API bounds each REST API listener's connections (--api-max-conns,
	// --api-max-conns-per-source); zero fields: DefaultAPILimits.
	API accept.Limits
	// AuditKeep is how many audit entries the store keeps, the oldest
	// dropped first (--audit-keep): 0 is DefaultAuditKeep; negative keeps
	// no audit trail.
	AuditKeep int
	// MetricsAddr is the operations port (internal/opsport): /metrics,
	// /healthz, /readyz, /version; empty: none (the REST API serves
	// /metrics too).
	MetricsAddr string
	// Location bounds the location server's streams
	// (--location-max-conns, --location-max-conns-per-source,
	// --location-idle-timeout); zero fields: vnatloc.DefaultStreamLimits.
	Location accept.Limits
	// Plan is the address plan a new cloud is created with (--plan,
	// addrplan.Parse; a topology file's plan line is the same). Empty:
	// the store's, or the default for a new cloud. A plan other than the
	// store's on a cloud that holds anything stops the controller.
	Plan string
}

// DefaultAPILimits bound a REST API listener: an operator's CLI and
// scripts, the lab and a few automations keep far fewer connections than
// 64 from one address, and 1024 in all is well within the controller's
// descriptors. net/http times the waits (accept.HTTPServer).
var DefaultAPILimits = accept.Limits{PerSource: 64, Total: 1024}

// Validate reports the first configuration mistake.
func (c DaemonConfig) Validate() error {
	if len(c.EtcdEndpoints) == 0 && c.DataDir == "" {
		return errors.New("--data-dir is required for the embedded etcd (or give --etcd-endpoints)")
	}
	if len(c.EtcdEndpoints) == 0 && c.ClientURL == "" {
		return errors.New("--client-url is required for the embedded etcd (or give --etcd-endpoints)")
	}
	if c.LISPSiteKeys != "" && c.LISPListen == "" {
		return errors.New("--lisp-site-keys without --lisp-listen: give the map-server an address, e.g. --lisp-listen 192.168.100.1:4342")
	}
	if err := c.API.Validate("--api-max-conns-per-source", "--api-max-conns", "API idle timeout"); err != nil {
		return err
	}
	if err := c.Location.Validate("--location-max-conns-per-source", "--location-max-conns", "--location-idle-timeout"); err != nil {
		return err
	}
	if err := c.TLS.CheckMode(c.Insecure, "the controller serves etcd and the REST API"); err != nil {
		return err
	}
	if c.Insecure && c.APITokenFile != "" {
		return errors.New("--api-token-file with --insecure: the token would cross the fabric in clear; drop --insecure and give --tls-ca, --tls-cert and --tls-key")
	}
	if len(c.EtcdEndpoints) == 0 {
		if err := pki.CheckURL("--client-url", c.ClientURL, c.Insecure); err != nil {
			return err
		}
	}
	for _, e := range c.EtcdEndpoints {
		if err := pki.CheckURL("--etcd-endpoints", e, c.Insecure); err != nil {
			return err
		}
	}
	return nil
}

// RunDaemon runs the controller until ctx ends.
func RunDaemon(ctx context.Context, cfg DaemonConfig, log *slog.Logger) error {
	err := runDaemon(ctx, cfg, log)
	if err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		// Told to stop while still starting (seeding the store, say): that
		// is a shutdown like any other, not a failure to report.
		log.Info("controller stopped while starting", "err", err)
		return nil
	}
	return err
}

func runDaemon(ctx context.Context, cfg DaemonConfig, log *slog.Logger) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	var t *topology.File
	if cfg.Topology != "" {
		var err error
		if t, err = topology.Load(cfg.Topology); err != nil {
			return err
		}
	}
	// Read every file up front, so a wrong one is named before anything
	// starts listening.
	var apiTLS, etcdTLS *tls.Config
	var token string
	if cfg.Insecure {
		log.Warn("--insecure: etcd and the REST API's TCP listener take plain TCP from anyone who reaches them")
	} else {
		var err error
		if apiTLS, err = cfg.TLS.ServerConfig(tls.VerifyClientCertIfGiven); err != nil {
			return fmt.Errorf("--tls-*: %w", err)
		}
		if etcdTLS, err = cfg.TLS.ClientConfig(); err != nil {
			return fmt.Errorf("--tls-* (the controller dials etcd with them): %w", err)
		}
		if cfg.APITokenFile != "" {
			if token, err = pki.ReadToken(cfg.APITokenFile); err != nil {
				return fmt.Errorf("--api-token-file: %w", err)
			}
		}
	}
	endpoints := cfg.EtcdEndpoints
	if len(endpoints) == 0 {
		if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
			return fmt.Errorf("etcd data dir: %w", err)
		}
		socket := cfg.Socket
		if !cfg.Insecure {
			socket = "" // served below, as the controller (serveEtcdSocket)
		}
		e, err := EmbeddedEtcdWith(cfg.DataDir, cfg.ClientURL, socket, cfg.PeerURL, cfg.TLS, EtcdOptions{Quota: cfg.EtcdQuota})
		if err != nil {
			return err
		}
		defer e.Close()
		log.Info("embedded etcd ready", "client_url", cfg.ClientURL, "socket", cfg.Socket, "data_dir", cfg.DataDir, "tls", !cfg.Insecure)
		endpoints = []string{cfg.ClientURL}
	}
	s, err := store.DialEtcdTLS(endpoints, etcdTLS)
	if err != nil {
		return err
	}
	defer s.Close()
	c := New(s, log)
	if err := enableEtcdAuth(ctx, c, s, cfg); err != nil {
		return err
	}
	switch {
	case cfg.AuditKeep < 0:
		c.SetAuditKeep(0)
		log.Warn("--audit-keep 0: no audit trail; writes are not recorded")
	case cfg.AuditKeep > 0:
		c.SetAuditKeep(cfg.AuditKeep)
	}
	// Every tenant token and certificate revocation is loaded before the
	// API serves: no token is refused for not being known yet, and a
	// revoked credential is refused from then on.
	tokRev, err := c.LoadTenantCredentials(ctx)
	if err != nil {
		return err
	}
	go c.WatchTenantCredentials(ctx, tokRev)
	if cfg.LocationListen != "" {
		var relayTLS *tls.Config
		if cfg.Insecure {
			log.Warn("--insecure: the VNAT location server takes no relay: VMs' location streams need their hosts' agent certificates")
		} else if relayTLS, err = cfg.TLS.ServerConfig(tls.RequireAndVerifyClientCert); err != nil {
			return fmt.Errorf("--tls-* (the location server's relay channel): %w", err)
		}
		if _, err := c.serveLocations(ctx, cfg.LocationListen, cfg.Location, relayTLS, log); err != nil {
			return err
		}
	}
	// The embedded member compacts itself (EmbeddedEtcdWith); an external
	// cluster is compacted by the controller, which is its only writer
	// of intent and desired state.
	retain := int64(0)
	if len(cfg.EtcdEndpoints) > 0 {
		retain = CompactRetain
	}
	maint := NewStoreMaintainer(s, retain, log)
	c.SetStoreMaintainer(maint)
	every := cfg.MaintainEvery
	if every <= 0 {
		every = 30 * time.Second
	}
	go maint.Run(ctx, every)
	if err := c.choosePlan(ctx, cfg.Plan, t); err != nil {
		return err
	}
	if t != nil {
		// The file seeds an empty store only: once intent exists, the API
		// owns it, and a restarted controller must not undo API changes.
		existing, _, err := s.List(ctx, intent.HostsPrefix)
		if err != nil {
			return err
		}
		if len(existing) == 0 {
			if err := c.ApplyTopology(ctx, t); err != nil {
				return fmt.Errorf("apply topology %s: %w", cfg.Topology, err)
			}
		} else {
			log.Info("intent already in the store; topology file not re-applied", "file", cfg.Topology)
		}
	}
	// Before the API serves: a capture record now is a dead capture's.
	if _, err := c.ClearCaptures(ctx); err != nil {
		return err
	}
	if err := c.ClearObserves(ctx); err != nil {
		return err
	}
	// Every host's agent has its etcd user before the local tools (the
	// lab) find the store answering and start agents.
	if err := c.SyncAgentUsers(ctx); err != nil {
		return err
	}
	if len(cfg.EtcdEndpoints) == 0 && !cfg.Insecure && cfg.Socket != "" {
		if err := serveEtcdSocket(ctx, cfg.Socket, cfg.ClientURL, etcdTLS, c.listeners, log); err != nil {
			return err
		}
	}
	for _, l := range []struct{ network, addr string }{{"unix", cfg.APISocket}, {"tcp", cfg.APIListen}} {
		if l.addr == "" {
			continue
		}
		if l.network == "unix" {
			os.Remove(l.addr) // left by a killed controller
		}
		nl, err := net.Listen(l.network, l.addr)
		if err != nil {
			return fmt.Errorf("api listener %s: %w", l.addr, err)
		}
		name := "api"
		if l.network == "unix" {
			name = "api_socket"
		}
		// Under TLS: a refused connection costs no handshake.
		lim := cfg.API.Or(DefaultAPILimits)
		lim.Idle = 0 // net/http's timeouts: a long handler is not idle
		var ln net.Listener = accept.Wrap(nl, accept.Options{Name: name, Limits: lim, Log: log, Stats: c.listeners})
		handler := c.API()
		switch {
		case l.network == "unix":
			// Local tools need no credentials: only root may connect.
			if err := os.Chmod(l.addr, 0o600); err != nil {
				ln.Close()
				return fmt.Errorf("api socket %s: %w", l.addr, err)
			}
		case apiTLS != nil:
			ln = tls.NewListener(ln, apiTLS)
			handler = c.Authenticate(handler, token)
		}
		srv := accept.HTTPServer(handler)
		srv.ErrorLog = limitedErrorLog(log, 5)
		go srv.Serve(ln)
		defer srv.Close()
		log.Info("serving REST API", "on", l.network+":"+l.addr, "tls", l.network == "tcp" && apiTLS != nil)
	}
	if cfg.LISPListen != "" {
		if err := c.startLISP(ctx, cfg); err != nil {
			return err
		}
	}
	if cfg.MetricsAddr != "" {
		ln, err := opsport.Listen("--metrics-addr", cfg.MetricsAddr)
		if err != nil {
			return err
		}
		// Every listener is up by now: ready is the store answering.
		opsport.Serve(ctx, ln, opsport.Config{Daemon: "controller", Gatherer: c.metricsRegistry(), Stats: c.listeners, Log: log,
			Ready: func() error { return c.StoreReachable(ctx) }})
	}
	log.Info("controller running", "etcd", endpoints)
	// Only now: a unit ordered after this one finds the API answering.
	sdnotify.Tell(log, sdnotify.Ready, sdnotify.Status("serving the REST API"))
	defer sdnotify.Tell(log, sdnotify.Stopping)
	return c.Run(ctx)
}

// enableEtcdAuth turns etcd's authentication on with the controller's
// certificate as its administrator (etcdauth.go). An --insecure
// controller has no certificate, so no user: it refuses a store whose
// auth a controller with TLS turned on, rather than fail at every request.
func enableEtcdAuth(ctx context.Context, c *Controller, s *store.Etcd, cfg DaemonConfig) error {
	if cfg.Insecure {
		on, err := s.AuthEnabled(ctx)
		if errors.Is(err, store.ErrNoAuthStatus) {
			return nil // an old cluster: its refusals will say
		}
		if err != nil {
			return err
		}
		if on {
			return errors.New("etcd has authentication on (a controller with --tls-* turned it on): an --insecure controller is no etcd user; give --tls-ca, --tls-cert and --tls-key")
		}
		return nil
	}
	admin, err := cfg.TLS.CommonName()
	if err != nil {
		return fmt.Errorf("--tls-cert: %w", err)
	}
	return c.EnableEtcdAuth(ctx, s, admin)
}

// choosePlan settles the address plan before any intent is written: the
// one --plan or the topology file asks for (they must agree), else the
// store's (the default for a new cloud).
func (c *Controller) choosePlan(ctx context.Context, flag string, t *topology.File) error {
	want, from := flag, "--plan"
	if t != nil && t.Plan != "" {
		if want != "" && want != t.Plan {
			p1, _ := addrplan.Parse(want)
			p2, _ := addrplan.Parse(t.Plan)
			if p1 != p2 {
				return fmt.Errorf("--plan %s and topology %s's plan %s differ: give one", want, t.Path, t.Plan)
			}
		}
		want, from = t.Plan, "topology "+t.Path+" plan"
	}
	if want == "" {
		_, err := c.UseStoredPlan(ctx)
		return err
	}
	p, err := addrplan.Parse(want)
	if err != nil {
		return fmt.Errorf("%s: %w", from, err)
	}
	if err := c.SetPlan(ctx, p); err != nil {
		return fmt.Errorf("%s: %w", from, err)
	}
	return nil
}
