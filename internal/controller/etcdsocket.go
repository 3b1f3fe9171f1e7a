package controller

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"sync"
	"time"

	"github.com/onehop/onehop/internal/accept"
	"github.com/onehop/onehop/internal/ratelog"
)

// etcdSocketLimits bound the local tools' socket: the lab and an
// operator's etcdctl hold a few connections (all of a unix socket's are
// one source).
var etcdSocketLimits = accept.Limits{PerSource: 256, Total: 256}

// serveEtcdSocket serves the embedded etcd to this machine's tools on a
// unix socket (made 0600: root only) while etcd takes TLS clients only and
// checks users: etcd's auth knows no user on a plain connection, so each
// connection is carried, byte for byte, inside a TLS connection to
// clientURL made with tc, the controller's own certificate. A tool speaks
// plain gRPC as before (etcdctl --endpoints unix://SOCKET) and etcd sees
// the controller, its administrator: root on this machine can read the
// controller's key anyway. It serves until ctx ends.
func serveEtcdSocket(ctx context.Context, socket, clientURL string, tc *tls.Config, stats *accept.Stats, log *slog.Logger) error {
	u, err := url.Parse(clientURL)
	if err != nil {
		return fmt.Errorf("etcd client url %q: %w", clientURL, err)
	}
	os.Remove(socket) // a socket left by a killed controller blocks the listen
	nl, err := net.Listen("unix", socket)
	if err != nil {
		return fmt.Errorf("etcd socket %s: %w", socket, err)
	}
	if err := os.Chmod(socket, 0o600); err != nil {
		nl.Close()
		return fmt.Errorf("etcd socket %s: %w", socket, err)
	}
	ln := accept.Wrap(nl, accept.Options{Name: "etcd_socket", Limits: etcdSocketLimits, Log: log, Stats: stats})
	up := tc.Clone()
	up.NextProtos = []string{"h2"} // gRPC: etcd and grpc-go refuse TLS without ALPN
	d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: 5 * time.Second}, Config: up}
	failed := ratelog.New(log, 1, time.Second, nil)
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return // closed
			}
			go func() {
				defer c.Close()
				e, err := d.DialContext(ctx, "tcp", u.Host)
				if err != nil {
					failed.Warn("dial", "etcd socket: cannot reach etcd over TLS", "url", clientURL, "err", err)
					return
				}
				splice(c, e)
			}()
		}
	}()
	return nil
}

// splice copies a to b and b to a until either side ends, then closes
// both.
func splice(a, b net.Conn) {
	var once sync.Once
	closeBoth := func() { a.Close(); b.Close() }
	var wg sync.WaitGroup
	wg.Add(2)
	for _, p := range [][2]net.Conn{{a, b}, {b, a}} {
		go func() {
			defer wg.Done()
			io.Copy(p[0], p[1])
			once.Do(closeBoth)
		}()
	}
	wg.Wait()
}
