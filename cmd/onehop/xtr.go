package main

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/onehop/onehop/internal/xtr"
)

func xtrCmd() *cobra.Command {
	x := &cobra.Command{
		Use:   "xtr",
		Short: "The data center's LISP tunnel router (xTR) for multipath cloud access",
		Long: `The xTR sits between the wide-area paths and the data center's EID prefix.
It encapsulates and decapsulates LISP (RFC 9300) in the kernel
(docs/lisp-datapath.md), registers the site's EID prefix behind one RLOC per
path with authenticated Map-Registers (RFC 9301, HMAC-SHA-256), and asks the
map-resolver for the mappings its replies need (an access gateway's per-path
EIDs) when such an EID first opens a connection, then again whenever the
record's TTL runs out. docs/cloud-access-lab.md shows it in the lab.`,
	}
	var (
		rlocs, eidDevs, prefixes        []string
		mapServer, mapResolver, keyFile string
		keyID                           uint8
		ttl, interval                   time.Duration
		whole, siteWhole                bool
		metricsAddr                     string
		logs                            *logFlags
	)
	run := &cobra.Command{
		Use:   "run --rloc IF ... --eid-dev IF ... --eid-prefix PREFIX --map-server ADDR --key-file FILE",
		Short: "Run the xTR in this network namespace",
		Long: `Puts the LISP datapath on every --rloc interface (decapsulation in,
encapsulation out) and every --eid-dev interface (encapsulation of what the
site sends to remote EIDs), sets ip_forward=1 and rp_filter=0, and runs
until interrupted; the datapath goes when it ends.

Registration: each --eid-prefix behind every --rloc's address (the
interface's first IPv4 address unless addr= is given), with its priority and
weight (default 1 and 50: every path used), refreshed every
--register-interval; the map-server must answer with an authenticated
Map-Notify (its site-keys file holds the same key and key id).

Mappings for replies: a packet socket on each --rloc interface sees the
encapsulated TCP SYNs of remote EIDs; the first from an EID makes the xTR
ask --map-resolver (default: --map-server) and install one tunnel per usable
locator its RLOC interfaces reach (by the routes), then hands that first SYN
to the site again (the first copy found no tunnel or its answer no mapping),
so the server answers at once. The mapping is asked for again when its TTL
runs out.`,
		Example: `  onehop xtr run --rloc wan1 --rloc wan2 --eid-dev s-srv --eid-prefix 10.88.0.0/24 \
    --map-server 192.168.100.1 --key-file /run/onehop/cloud/lisp-key-xtr --key-id 2`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := buildXTRConfig(rlocs, eidDevs, prefixes, mapServer, mapResolver, keyFile, keyID, ttl, interval)
			if err != nil {
				return err
			}
			cfg.WholeSuperpackets, cfg.SiteWholeSuperpackets, cfg.MetricsAddr = whole, siteWhole, metricsAddr
			ctx, cancel := signalContext()
			defer cancel()
			return xtr.Run(ctx, cfg, logs.logger())
		},
	}
	f := run.Flags()
	f.StringArrayVar(&rlocs, "rloc", nil, "a WAN interface and its locator: IF[,addr=ADDR][,priority=P][,weight=W] (repeatable, at most 8)")
	f.StringArrayVar(&eidDevs, "eid-dev", nil, "a site-facing interface (repeatable or comma-separated)")
	f.StringArrayVar(&prefixes, "eid-prefix", nil, "the site's EID prefix to register (repeatable)")
	f.StringVar(&mapServer, "map-server", "", "LISP map-server ADDR[:4342] to register with")
	f.StringVar(&mapResolver, "map-resolver", "", "LISP map-resolver ADDR[:4342] (default: --map-server)")
	f.StringVar(&keyFile, "key-file", "", "file holding the site's shared secret (HMAC-SHA-256; trailing newline ignored)")
	f.Uint8Var(&keyID, "key-id", 1, "key id of the Map-Registers")
	f.DurationVar(&ttl, "ttl", xtr.DefaultTTL, "TTL of the registered records (whole minutes)")
	f.DurationVar(&interval, "register-interval", xtr.DefaultRegisterInterval, "how often the registration is refreshed")
	f.BoolVar(&whole, "whole-superpackets", false, "send TCP superpackets to the RLOC links' far ends whole, not segmented: only when every far end is an access gateway terminating what it receives (docs/lisp-datapath.md)")
	f.BoolVar(&siteWhole, "site-whole-superpackets", false, "take the gateways' TCP superpackets whole and hand them to the --eid-dev namespaces' sockets whole: only when every --eid-dev is a veth into a namespace of this host that terminates what it receives (docs/lisp-datapath.md); the gateways may then run with --whole-superpackets")
	addMetricsAddrFlag(run, &metricsAddr, "", "the loopback or a management address")
	logs = addLogFlags(run)
	x.AddCommand(run)
	return x
}

// buildXTRConfig turns run's flags into a validated Config.
func buildXTRConfig(rlocs, eidDevs, prefixes []string, mapServer, mapResolver, keyFile string, keyID uint8, ttl, interval time.Duration) (*xtr.Config, error) {
	cfg := &xtr.Config{KeyID: keyID, TTL: ttl, RegisterInterval: interval}
	var errs []error
	for _, s := range rlocs {
		r, err := xtr.ParseRLOC(s)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		cfg.RLOCs = append(cfg.RLOCs, r)
	}
	for _, d := range eidDevs {
		cfg.EIDDevs = append(cfg.EIDDevs, splitList(d)...)
	}
	for _, s := range prefixes {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("--eid-prefix %q: %w", s, err))
			continue
		}
		if p.Masked() != p {
			errs = append(errs, fmt.Errorf("--eid-prefix %s: host bits set (want %s)", p, p.Masked()))
			continue
		}
		cfg.EIDPrefixes = append(cfg.EIDPrefixes, p)
	}
	var err error
	if mapServer != "" {
		if cfg.MapServer, err = xtr.ParseServer("--map-server", mapServer); err != nil {
			errs = append(errs, err)
		}
	}
	if mapResolver != "" {
		if cfg.MapResolver, err = xtr.ParseServer("--map-resolver", mapResolver); err != nil {
			errs = append(errs, err)
		}
	}
	switch {
	case keyFile == "":
		errs = append(errs, errors.New("--key-file: the file with the site's secret is needed"))
	default:
		b, err := os.ReadFile(keyFile)
		if err != nil {
			errs = append(errs, fmt.Errorf("--key-file: %w", err))
		} else {
			cfg.Key = bytes.TrimRight(b, "\r\n")
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return cfg, nil
}
