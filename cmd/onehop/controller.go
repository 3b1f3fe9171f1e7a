package main

import (
	"github.com/spf13/cobra"

	"github.com/onehop/onehop/internal/controller"
	"github.com/onehop/onehop/internal/vnatloc"
)

func controllerCmd() *cobra.Command {
	var cfg controller.DaemonConfig
	var endpoints string
	var logs *logFlags
	c := &cobra.Command{
		Use:   "controller",
		Short: "Run the controller: intent, address allocation, per-host desired state",
		Long: `The controller is the only writer of intent. It allocates every VM's 10.f.s.h
address and virtual MAC, and compiles intent plus the agents' node reports into
each host's desired state under /onehop/desired/HOST in etcd.

By default it runs etcd embedded (data in --data-dir, served on --client-url
for agents and on --socket for local tools). With --etcd-endpoints it uses an
external etcd cluster instead.`,
		Example: `  onehop controller --data-dir /var/lib/onehop/etcd --client-url http://192.168.100.1:2379 --topology lab.yaml
  onehop controller --etcd-endpoints http://10.0.0.5:2379,http://10.0.0.6:2379`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg.EtcdEndpoints = splitList(endpoints)
			if cfg.AuditKeep <= 0 {
				cfg.AuditKeep = -1 // none, not the default
			}
			ctx, cancel := signalContext()
			defer cancel()
			return controller.RunDaemon(ctx, cfg, logs.logger())
		},
	}
	f := c.Flags()
	f.StringVar(&cfg.DataDir, "data-dir", "", "embedded etcd data directory")
	f.StringVar(&cfg.ClientURL, "client-url", "", "embedded etcd client URL, http://IP:PORT, reachable by agents")
	f.StringVar(&cfg.Socket, "socket", "", "unix socket the embedded etcd also serves, root only (optional; with TLS its clients act as the controller, etcd's administrator)")
	f.StringVar(&cfg.PeerURL, "peer-url", "", "embedded etcd peer URL, loopback only (default http://127.0.0.1:2380)")
	f.StringVar(&endpoints, "etcd-endpoints", "", "comma-separated external etcd endpoints; disables the embedded etcd")
	f.StringVar(&cfg.Topology, "topology", "", "topology file whose hosts, farms, subnets and VMs seed an empty store")
	f.StringVar(&cfg.Plan, "plan", "", "address plan of a new cloud, PREFIX:FARM/SUBNET/VM bits (default 10.0.0.0/8:8/8/8; fixed once the cloud holds anything)")
	f.StringVar(&cfg.APISocket, "api-socket", "", "unix socket to serve the REST API on")
	f.StringVar(&cfg.APIListen, "api-listen", "", "TCP address to serve the REST API on, e.g. 127.0.0.1:8080")
	f.StringVar(&cfg.LISPListen, "lisp-listen", "", "UDP address of the LISP map-server/map-resolver, e.g. 192.168.100.1:4342 (default: none)")
	f.StringVar(&cfg.LISPSiteKeys, "lisp-site-keys", "", "file of LISP sites that may register: NAME KEY-ID SECRET EID-PREFIX[,...] a line (mode 600)")
	f.StringVar(&cfg.LocationListen, "location-listen", ":2031", "TCP address of the VNAT location server (VCMP location queries and stores; docs/vnat-location.md); empty: none")
	f.IntVar(&cfg.API.Total, "api-max-conns", controller.DefaultAPILimits.Total, "most REST API connections at once, per listener; more are closed at once and counted (onehop_listener_refused_total)")
	f.IntVar(&cfg.API.PerSource, "api-max-conns-per-source", controller.DefaultAPILimits.PerSource, "most REST API connections one address may hold at once")
	f.IntVar(&cfg.Location.Total, "location-max-conns", vnatloc.DefaultStreamLimits.Total, "most location-server streams at once")
	f.IntVar(&cfg.Location.PerSource, "location-max-conns-per-source", vnatloc.DefaultStreamLimits.PerSource, "most location-server streams one address (a host's relay, an external) may hold at once")
	f.DurationVar(&cfg.Location.Idle, "location-idle-timeout", vnatloc.DefaultStreamLimits.Idle, "end a location-server stream on which nothing moved for this long")
	f.Int64Var(&cfg.EtcdQuota, "etcd-quota-bytes", 0, "embedded etcd's database quota: beyond it etcd raises NOSPACE and refuses writes (0: etcd's 2 GiB)")
	f.IntVar(&cfg.AuditKeep, "audit-keep", controller.DefaultAuditKeep, "audit entries kept in the store, the oldest dropped first (docs/tenants.md); 0: no audit trail")
	addControllerTLSFlags(c, &cfg)
	addMetricsAddrFlag(c, &cfg.MetricsAddr, controller.DefaultMetricsAddr, "the loopback by default; /metrics is on the REST API too")
	logs = addLogFlags(c)
	return c
}
