package controller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/onehop/onehop/internal/intent"
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
}

// Validate reports the first configuration mistake.
func (c DaemonConfig) Validate() error {
	if len(c.EtcdEndpoints) == 0 && c.DataDir == "" {
		return errors.New("--data-dir is required for the embedded etcd (or give --etcd-endpoints)")
	}
	if len(c.EtcdEndpoints) == 0 && c.ClientURL == "" {
		return errors.New("--client-url is required for the embedded etcd (or give --etcd-endpoints)")
	}
	return nil
}

// RunDaemon runs the controller until ctx ends.
func RunDaemon(ctx context.Context, cfg DaemonConfig, log *slog.Logger) error {
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
	endpoints := cfg.EtcdEndpoints
	if len(endpoints) == 0 {
		if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
			return fmt.Errorf("etcd data dir: %w", err)
		}
		e, err := EmbeddedEtcd(cfg.DataDir, cfg.ClientURL, cfg.Socket, cfg.PeerURL)
		if err != nil {
			return err
		}
		defer e.Close()
		log.Info("embedded etcd ready", "client_url", cfg.ClientURL, "socket", cfg.Socket, "data_dir", cfg.DataDir)
		endpoints = []string{cfg.ClientURL}
	}
	s, err := store.DialEtcd(endpoints)
	if err != nil {
		return err
	}
	defer s.Close()
	c := New(s, log)
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
	for _, l := range []struct{ network, addr string }{{"unix", cfg.APISocket}, {"tcp", cfg.APIListen}} {
		if l.addr == "" {
			continue
		}
		if l.network == "unix" {
			os.Remove(l.addr) // left by a killed controller
		}
		ln, err := net.Listen(l.network, l.addr)
		if err != nil {
			return fmt.Errorf("api listener %s: %w", l.addr, err)
		}
		srv := &http.Server{Handler: c.API(), ReadHeaderTimeout: 5 * time.Second}
		go srv.Serve(ln)
		defer srv.Close()
		log.Info("serving REST API", "on", l.network+":"+l.addr)
	}
	log.Info("controller running", "etcd", endpoints)
	return c.Run(ctx)
}
