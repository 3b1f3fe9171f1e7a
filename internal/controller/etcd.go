package controller

import (
	"fmt"
	"net/url"
	"os"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// EmbeddedEtcd starts a single-member etcd in dataDir, serving clients on
// clientURL (http://IP:PORT, for agents over the fabric) and on a unix socket
// (for the operator's CLI on the machine, whatever namespace it is in).
// Its peer URL is loopback-only: the embedded member never has peers; to
// grow, point every component at an external cluster with --etcd-endpoints.
func EmbeddedEtcd(dataDir, clientURL, socket, peerURL string) (*embed.Etcd, error) {
	cu, err := url.Parse(clientURL)
	if err != nil || cu.Scheme != "http" || cu.Port() == "" {
		return nil, fmt.Errorf("etcd client url %q: want http://IP:PORT", clientURL)
	}
	cfg := embed.NewConfig()
	cfg.Name = "onehop"
	cfg.Dir = dataDir
	cfg.LogLevel = "error"
	cfg.ListenClientUrls = []url.URL{*cu}
	if socket != "" {
		os.Remove(socket) // a socket left by a killed controller blocks the listen
		cfg.ListenClientUrls = append(cfg.ListenClientUrls, url.URL{Scheme: "unix", Path: socket})
	}
	cfg.AdvertiseClientUrls = []url.URL{*cu}
	if peerURL == "" {
		peerURL = "http://127.0.0.1:2380"
	}
	pu, err := url.Parse(peerURL)
	if err != nil {
		return nil, fmt.Errorf("etcd peer url %q: %w", peerURL, err)
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
		return e, nil
	case <-time.After(30 * time.Second):
		e.Close()
		return nil, fmt.Errorf("embedded etcd in %s not ready after 30s", dataDir)
	}
}
