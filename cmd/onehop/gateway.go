package main

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/onehop/onehop/internal/gateway"
)

func gatewayCmd() *cobra.Command {
	var control string
	g := &cobra.Command{
		Use:   "gateway",
		Short: "Multipath cloud access: the TCP-to-MPTCP gateway (A-MPTCP) and its connections",
		Long: `The access gateway takes a user's plain TCP connections transparently
(nftables TPROXY on the user-facing interfaces; the user's machine is
configured with nothing), asks the mapping system where the destination
lives, and re-opens each connection as MPTCP from the gateway's own EIDs:
one subflow per usable RLOC of the destination (priority 255 = unusable, at
most 8), each pinned to its own wide-area path, bytes spliced both ways in
the kernel. A server without MPTCP gets plain TCP over the best RLOC; a
destination with no mapping is forwarded natively.

The status command talks to the daemon of the network namespace it runs in
(a unix socket under ` + gateway.ControlDir + `, named by the namespace), so
  onehop lab exec gw -- onehop gateway status
shows gw's connections. docs/cloud-access-gateway.md has the details.`,
	}
	g.PersistentFlags().StringVar(&control, "control", "", "control socket (default: this network namespace's, under "+gateway.ControlDir+")")
	sock := func() (string, error) {
		if control != "" {
			return control, nil
		}
		return gateway.DefaultControl()
	}

	var (
		intercept, paths, maps []string
		infra                  []string
		eidPrefix, resolver    string
		mapServer, keyFile     string
		fwmark                 string
		cfg                    = gateway.Config{}
		listenPort             uint16
		logs                   *logFlags
	)
	run := &cobra.Command{
		Use:   "run --intercept IF --eid-prefix PREFIX --path dev=IF,eid=ADDR[,rloc=ADDR] ... (--map PREFIX=RLOC,... | --map-resolver ADDR)",
		Short: "Run the access gateway in this network namespace",
		Long: `Sets up this network namespace as the access gateway and proxies until
interrupted, then removes all it set up:
  - MPTCP on, with the userspace path manager (net.mptcp.pm_type=1): the
    gateway itself opens each connection's subflows, one per usable RLOC;
  - each --path's EID on lo, an ip rule from that EID to the path's own
    table (Table+1+i), which ends in an unreachable default so a subflow never
    leaks onto another path;
  - nftables table ip ` + gateway.NFTTable + `: anything arriving on an --intercept
    interface for an --infrastructure address (and --map-server's,
    --map-resolver's) is dropped and counted (infrastructure_dropped in
    status); TCP for an address not the gateway's own goes to the TPROXY
    listener, marked --fwmark, delivered by table --table;
  - every socket it opens or accepts uses --congestion (default cubic: bbr
    subflows ran at 0.6 Gbit/s on this kernel, cubic at 18).
A path whose link goes down loses its subflows at once (the connections go
on over the others); when it comes back its routes are pinned again and
every connection gets its subflow back.

Mappings come from --map-resolver (LISP Map-Request/Map-Reply, cached for
the record's TTL) and --map (static mappings, asked first; for labs without
a map-server). An address with no mapping is forwarded natively.`,
		Example: `  onehop gateway run --intercept eth0 --eid-prefix 10.77.0.0/24 \
    --path dev=wan1,eid=10.77.0.1,rloc=192.0.2.1 --path dev=wan2,eid=10.77.0.2,rloc=198.51.100.1 \
    --map 10.88.0.0/24=192.0.2.2,198.51.100.2`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if keyFile != "" {
				if cfg.MapServerKey != "" {
					return fmt.Errorf("--map-server-key-file: give the key once (--map-server-key is set too)")
				}
				b, err := os.ReadFile(keyFile)
				if err != nil {
					return fmt.Errorf("--map-server-key-file: %w", err)
				}
				if cfg.MapServerKey = strings.TrimSpace(string(b)); cfg.MapServerKey == "" {
					return fmt.Errorf("--map-server-key-file %s: empty", keyFile)
				}
			}
			for _, v := range infra {
				for _, a := range splitList(v) {
					p, err := gateway.ParseInfrastructure(a)
					if err != nil {
						return err
					}
					cfg.Infrastructure = append(cfg.Infrastructure, p)
				}
			}
			c, res, err := buildGatewayConfig(cfg, intercept, paths, maps, eidPrefix, resolver, mapServer, fwmark, listenPort)
			if err != nil {
				return err
			}
			c.Control = control
			ctx, cancel := signalContext()
			defer cancel()
			return gateway.Run(ctx, c, res, logs.logger())
		},
	}
	f := run.Flags()
	f.StringArrayVar(&intercept, "intercept", nil, "user-facing interface whose TCP is intercepted (repeatable or comma-separated)")
	f.StringVar(&eidPrefix, "eid-prefix", "", "the gateway's EID prefix (every --path eid lies in it)")
	f.StringArrayVar(&paths, "path", nil, "a wide-area path: dev=IF,eid=ADDR[,rloc=ADDR][,name=NAME] (repeatable, at most 8)")
	f.StringArrayVar(&maps, "map", nil, "a static mapping: EID-PREFIX=RLOC[/PRIORITY[/WEIGHT]],... or EID-PREFIX=negative (repeatable)")
	f.StringVar(&resolver, "map-resolver", "", "LISP map-resolver ADDR[:4342]")
	f.Uint16Var(&listenPort, "listen-port", gateway.DefaultListenPort, "TPROXY listener port")
	f.StringVar(&fwmark, "fwmark", fmt.Sprintf("0x%x", gateway.DefaultFWMark), "firewall mark of intercepted packets")
	f.IntVar(&cfg.Table, "table", gateway.DefaultTable, "routing table delivering intercepted packets; path i uses table+1+i")
	f.IntVar(&cfg.RulePriority, "rule-priority", gateway.DefaultRulePriority, "priority of the first ip rule the gateway adds (path i: +1+i)")
	f.StringVar(&cfg.Congestion, "congestion", gateway.DefaultCongestion, "congestion control of every socket the gateway opens or accepts")
	f.IntVar(&cfg.MaxPerClient, "max-per-client", gateway.DefaultMaxPerClient, "most connections one user address may have through the gateway at once (0: no bound)")
	f.IntVar(&cfg.MaxConns, "max-conns", gateway.DefaultMaxConns, "most connections through the gateway at once, all users together (0: no bound)")
	f.BoolVar(&cfg.LISP, "lisp", false, "encapsulate each path's subflows in LISP (in-kernel datapath) from the path's rloc= to the destination's RLOC")
	f.BoolVar(&cfg.WholeSuperpackets, "whole-superpackets", false, "send the subflows' TCP superpackets to the xTRs whole, not segmented (with --lisp): only when every xTR takes them whole, one run with --site-whole-superpackets or on a kernel that decapsulates superpackets (docs/lisp-datapath.md)")
	f.StringVar(&mapServer, "map-server", "", "LISP map-server ADDR[:4342] to register each path's EID behind its RLOC (with --lisp)")
	f.StringVar(&cfg.MapServerKey, "map-server-key", "", "the key of Map-Registers to --map-server (HMAC-SHA-256; visible in ps: prefer --map-server-key-file)")
	f.StringVar(&keyFile, "map-server-key-file", "", "file holding the key of Map-Registers to --map-server")
	f.Uint8Var(&cfg.KeyID, "key-id", 1, "the key id of Map-Registers to --map-server")
	f.DurationVar(&cfg.ProbeInterval, "rloc-probe-interval", 0,
		"RLOC-probe each locator in use this often over its path, so a far side that fails is noticed with the local link up (RFC 9301; 0: off; needs rloc= on every path; the lab uses 1s)")
	f.StringArrayVar(&infra, "infrastructure", nil, "an address or prefix users are never forwarded to, in any protocol: the controller, the hosts, the fabric (repeatable or comma-separated; --map-server and --map-resolver are always in it)")
	f.IntVar(&cfg.ProbeMisses, "rloc-probe-misses", gateway.DefaultProbeMisses, "unanswered probes in a row that take a locator down (its subflows closed until one is answered)")
	addMetricsAddrFlag(run, &cfg.MetricsAddr, "", "its users' addresses and the paths' are counted there: the loopback or a management address")
	logs = addLogFlags(run)

	var output outputFormat
	status := &cobra.Command{
		Use:   "status [-o json]",
		Short: "The gateway's paths and connections: subflows, their paths and RLOCs, bytes",
		Long: `Lists the paths (up or down) and each connection the gateway carries or
carried lately: the user, the original destination, its mode (mptcp,
tcp-fallback when the server does not speak MPTCP, native when the
destination has no mapping), and for each subflow the path it is pinned to,
its addresses, the RLOC its path carries it to and the bytes sent (acked)
and received on it (the kernel's tcp_info of each subflow).`,
		Example: "  onehop gateway status\n  onehop lab exec gw -- onehop gateway status -o json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := sock()
			if err != nil {
				return err
			}
			r, err := gateway.Ask(p, gateway.Request{Op: "status"})
			if err != nil {
				return err
			}
			return printGatewayStatus(cmd.OutOrStdout(), r, output)
		},
	}
	addOutputFlag(status.Flags(), &output)
	g.AddCommand(run, status)
	return g
}

// buildGatewayConfig turns run's flags into a validated Config and its resolver.
func buildGatewayConfig(cfg gateway.Config, intercept, paths, maps []string, eidPrefix, resolver, mapServer, fwmark string, port uint16) (*gateway.Config, gateway.Resolver, error) {
	var errs []error
	for _, i := range intercept {
		cfg.Intercept = append(cfg.Intercept, splitList(i)...)
	}
	if eidPrefix != "" {
		p, err := netip.ParsePrefix(eidPrefix)
		if err != nil {
			errs = append(errs, fmt.Errorf("--eid-prefix %q: %w", eidPrefix, err))
		} else {
			cfg.EIDPrefix = p.Masked()
		}
	}
	for _, s := range paths {
		p, err := gateway.ParsePath(s)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		cfg.Paths = append(cfg.Paths, p)
	}
	for _, s := range maps {
		r, err := gateway.ParseMap(s)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		cfg.Static = append(cfg.Static, r)
	}
	parseServer := func(flag, v string) netip.AddrPort {
		if v == "" {
			return netip.AddrPort{}
		}
		ap, err := netip.ParseAddrPort(v)
		if err != nil {
			a, aerr := netip.ParseAddr(v)
			if aerr != nil {
				errs = append(errs, fmt.Errorf("%s %q: want ADDR or ADDR:PORT", flag, v))
			}
			ap = netip.AddrPortFrom(a, 4342)
		}
		return ap
	}
	cfg.MapResolver = parseServer("--map-resolver", resolver)
	cfg.MapServer = parseServer("--map-server", mapServer)
	m, err := strconv.ParseUint(fwmark, 0, 32)
	if err != nil {
		errs = append(errs, fmt.Errorf("--fwmark %q: want a number (0x4f48)", fwmark))
	}
	cfg.FWMark, cfg.ListenPort = uint32(m), port
	if len(errs) == 0 {
		if err := cfg.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return nil, nil, errors.Join(errs...)
	}
	var chain gateway.Chain
	if len(cfg.Static) > 0 {
		chain = append(chain, gateway.StaticResolver(cfg.Static))
	}
	if cfg.MapResolver.IsValid() {
		chain = append(chain, gateway.NewLISPResolver(cfg.MapResolver))
	}
	return &cfg, chain, nil
}

func printGatewayStatus(w io.Writer, r gateway.Reply, output outputFormat) error {
	if output == jsonOutput {
		return printJSON(w, r)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PATH\tDEV\tEID\tRLOC\tSTATE")
	for _, p := range r.Paths {
		rloc := "-"
		if p.RLOC.IsValid() {
			rloc = p.RLOC.String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", p.Name, p.Dev, p.EID, rloc, p.State())
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CONN\tCLIENT\tDEST\tMODE\tOPEN\tTO-SERVER\tTO-CLIENT\tNOTE")
	for _, c := range r.Conns {
		note := c.Why
		if c.Token != "" {
			note = fmt.Sprintf("token %s, paths %d/%d", c.Token, c.EstablishedPaths, c.PlannedPaths)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%v\t%d\t%d\t%s\n", c.ID, c.Client, c.Dest, c.Mode, c.Open, c.ToServer, c.ToClient, note)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CONN\tPATH\tLOCAL\tREMOTE\tRLOC\tSTATE\tSENT\tRECEIVED")
	for _, c := range r.Conns {
		for _, s := range c.Subflows {
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%d\t%d\n", c.ID, orDash(s.Path), s.Local, s.Remote, orDash(s.RLOC), s.State, s.BytesSent, s.BytesReceived)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	/* a connection with fewer paths than planned, and why */
	var missing []string
	for _, c := range r.Conns {
		for _, m := range c.Missing {
			missing = append(missing, fmt.Sprintf("%d\t%s\t%s", c.ID, m.Path, m.Reason))
		}
	}
	if len(missing) > 0 {
		fmt.Fprintln(w)
		tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "CONN\tMISSING-PATH\tWHY")
		for _, l := range missing {
			fmt.Fprintln(tw, l)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(r.Counters) > 0 {
		keys := make([]string, 0, len(r.Counters))
		for k := range r.Counters {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		parts := make([]string, len(keys))
		for i, k := range keys {
			parts[i] = fmt.Sprintf("%s=%d", k, r.Counters[k])
		}
		fmt.Fprintln(w, "counters: "+strings.Join(parts, " "))
	}
	return nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
