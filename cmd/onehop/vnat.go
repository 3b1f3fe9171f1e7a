package main

import (
	"fmt"
	"io"
	"sort"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/onehop/onehop/internal/vnatd"
)

func vnatCmd() *cobra.Command {
	var control string
	v := &cobra.Command{
		Use:   "vnat",
		Short: "Connection migration on an endpoint: its VNAT daemon, its connections, suspend and resume",
		Long: `VNAT keeps an endpoint's TCP connections and connected UDP sockets alive when
the endpoint's address changes (a VM moved to another subnet, an external
re-addressed). It runs on the endpoint itself: ` + "`onehop vnat run`" + ` in the endpoint's
network namespace translates each moved connection between its virtual
4-tuple (the one its sockets were opened with, never changing) and its
physical one (where its ends are now), in eBPF on the interface, and speaks
VCMP on TCP 2031 with its peers' daemons to learn where they went.

The other commands talk to the daemon of the network namespace they run in
(a unix socket under ` + vnatd.ControlDir + `, named by the namespace), so
  onehop lab exec m1 -- onehop vnat status
shows m1's connections. docs/vnat-daemon.md says how a restore works.`,
	}
	v.PersistentFlags().StringVar(&control, "control", "", "control socket (default: this network namespace's, under "+vnatd.ControlDir+")")
	sock := func() (string, error) {
		if control != "" {
			return control, nil
		}
		return vnatd.DefaultControl()
	}

	var o vnatd.Options
	keepaliveHelper, requireKeys := true, true
	var logs *logFlags
	run := &cobra.Command{
		Use:   "run --iface IFACE [--location-server ADDR]... [--allow-unkeyed]",
		Short: "Run the VNAT daemon of this endpoint (in its network namespace)",
		Long: `Loads the VNAT translation on IFACE (tcx ingress and egress), picks up the
connections already open in this network namespace (sock_diag; sockops too
with --cgroup), listens for VCMP on TCP 2031 and for control requests, and
watches IFACE's address. When it changes, every connection that travelled
from the old address is restored: the daemon asks where its peer is (the
secondary's old place, the primary's, then each --location-server), sends the
peer a keyed VNAT_UPD (one batch per peer), installs the answer's
translation and keeps the old address on lo, unannounced, for the sockets
bound to it. A peer's daemon answers the same way; an update that is forged,
replayed or unkeyed is refused, counted and logged at most once a second, and
its connection is left alone. Every 2 s it looks for new connections and
agrees keys with their peers' daemons (first contact), so a move with no
suspend is authenticated too. A source that keeps sending updates for
connections it does not own is throttled.

--allow-unkeyed takes unkeyed updates for connections that have no keys (a
peer whose daemon never agreed any), but only from the address the peer is
at, and at most ` + fmt.Sprint(vnatd.UnkeyedPerSecond) + ` a second per source: such a connection then follows
anyone who shares or spoofs its peer's address, and never a peer that moved
to another address (docs/connection-migration.md).

While a peer is away (it sent VNAT_SUSP_PRIMARY), helpers keep its
connections here alive: this end's egress answers the connection's own TCP
keepalive probes (--keepalive-helper, on by default), and --freeze-cgroup
freezes the application's cgroup until the peer is back.

The maps and links are pinned (--pin-dir; by default under ` + vnatd.PinRoot + `,
one directory per network namespace, when that is a bpffs): when the daemon
ends on a signal the translations stay in force and the next run takes them
over. ` + "`onehop vnat stop`" + ` ends it and removes them.`,
		Example: "  onehop vnat run --iface eth0\n  onehop vnat run --iface eth0 --location-server 10.0.0.1\n  onehop vnat run --iface eth0 --freeze-cgroup /sys/fs/cgroup/myapp",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := signalContext()
			defer cancel()
			o.Control, o.Logger = control, logs.logger()
			o.NoKeepaliveHelper = !keepaliveHelper
			if !requireKeys {
				return fmt.Errorf("--require-keys=false: keys are required by default; use --allow-unkeyed to take unkeyed updates")
			}
			return vnatd.Run(ctx, o)
		},
	}
	run.Flags().StringVar(&o.Iface, "iface", "eth0", "the endpoint's interface")
	run.Flags().StringArrayVar(&o.LocationServers, "location-server", nil, "a location server asked last on every locate walk: ADDR or vcmp://ADDR[:2031] (repeatable)")
	run.Flags().StringVar(&o.Conflict, "conflict", "abort", "default policy for a virtual-identification conflict (§3.4.2: the moved peer's tuple is another live connection's here): abort the migration, or preempt the connection already there")
	run.Flags().BoolVar(&o.AllowUnkeyed, "allow-unkeyed", false, "take unauthenticated updates for connections without agreed keys, from the peer's own address only and rate-limited (off: only keyed updates move a connection)")
	run.Flags().BoolVar(&requireKeys, "require-keys", true, "")
	run.Flags().MarkDeprecated("require-keys", "keys are required by default; --allow-unkeyed turns that off") //nolint:errcheck // the flag exists
	run.Flags().StringVar(&o.Cgroup, "cgroup", "", "cgroup v2 directory to attach sockops to (records new TCP connections as they open)")
	run.Flags().StringVar(&o.Listen, "listen", "", "VCMP listen address (default 0.0.0.0:2031)")
	run.Flags().BoolVar(&keepaliveHelper, "keepalive-helper", true, "while a peer is away, answer this end's own TCP keepalive probes for its connections (in eBPF)")
	run.Flags().StringVar(&o.PinDir, "pin-dir", "", "bpffs directory for the pinned maps and links (default "+vnatd.PinRoot+"/netns-INODE of this network namespace, if that is a bpffs)")
	addMetricsAddrFlag(run, &o.Metrics, "", "e.g. 127.0.0.1:9431")
	run.Flags().StringVar(&o.Metrics, "metrics", "", "")
	run.Flags().MarkDeprecated("metrics", "use --metrics-addr") //nolint:errcheck // the flag exists
	logs = addLogFlags(run)
	run.Flags().BoolVar(&o.NoPin, "no-pin", false, "pin nothing: the translations end with the daemon")
	run.Flags().IntVar(&o.VCMP.Total, "max-conns", vnatd.DefaultVCMPLimits.Total, "most VCMP connections served at once; more are closed at once and counted (onehop_listener_refused_total)")
	run.Flags().IntVar(&o.VCMP.PerSource, "max-conns-per-source", vnatd.DefaultVCMPLimits.PerSource, "most VCMP connections one address may hold at once")
	run.Flags().DurationVar(&o.VCMP.Idle, "idle-timeout", vnatd.DefaultVCMPLimits.Idle, "close a VCMP connection on which nothing moved for this long")
	run.Flags().StringVar(&o.FreezeCgroup, "freeze-cgroup", "", "cgroup v2 directory of the local application, frozen while any of its peers is away and thawed when they are back")
	run.Flags().DurationVar(&o.MaxAway, "max-away", vnatd.DefaultMaxAway, "how long this end keeps helping a connection whose suspended peer is away (answering its keepalives, its --freeze-cgroup frozen) before it stops and lets the application's own timeouts decide; 0: until the peer is back")

	var output outputFormat
	status := &cobra.Command{
		Use:   "status [-o json]",
		Short: "This endpoint's connections: virtual and physical 4-tuples, state, role, keyed",
		Long: `Lists the connections the daemon of this network namespace knows:
VIRTUAL is the 4-tuple the sockets use (their first physical one), PHYSICAL
where the ends are now (equal until one moves). STATE is active (never moved,
or untouched), suspended (roles negotiated, or waiting for the peer to find
it), locating (looking for the peer after a move), migrated (translated) or
aborted (nobody knew the peer, or a conflict). ROLE is primary or secondary
while migrating; KEYED says whether updates for it are authenticated; CONFLICT
is its policy for a virtual-identification conflict (abort or preempt).`,
		Example: "  onehop vnat status\n  onehop lab exec m1 -- onehop vnat status -o json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := sock()
			if err != nil {
				return err
			}
			r, err := vnatd.Ask(p, vnatd.Request{Op: "status"})
			if err != nil {
				return err
			}
			return printVNATStatus(cmd.OutOrStdout(), r, output)
		},
	}
	addOutputFlag(status.Flags(), &output)

	var all bool
	var conflict string
	// -o of suspend, resume and stop: json prints the daemon's reply.
	var actOutput outputFormat
	suspend := &cobra.Command{
		Use:   "suspend [--conflict abort|preempt] [--all | 'tcp LOCAL:PORT->REMOTE:PORT']",
		Short: "Before this end moves: claim the primary role and agree keys with the peers",
		Long: `Tells each peer that this end is about to move (VNAT_SUSP_PRIMARY with a fresh
X25519 key, one batch per peer): the peer becomes secondary, and the update
after the move is authenticated with keys bound to the connection. Without
a suspend a move still works (the mover is primary by default) and is
authenticated with the keys agreed at first contact; a connection that has
none moves only to a peer run with --allow-unkeyed, from the same address.
Name one connection as status prints its VIRTUAL column, or --all.`,
		Example: "  onehop vnat suspend --all\n  onehop vnat suspend 'tcp 10.0.1.5:40000->10.0.2.7:22'",
		Args:    cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if all == (len(args) == 1) {
				return fmt.Errorf("name one connection ('tcp LOCAL:PORT->REMOTE:PORT') or --all")
			}
			req := vnatd.Request{Op: "suspend", All: all, Conflict: conflict}
			if conflict != "" {
				if _, err := vnatd.ParseConflict(conflict); err != nil {
					return fmt.Errorf("--conflict: %w", err)
				}
			}
			if !all {
				if _, err := vnatd.ParseTuple(args[0]); err != nil {
					return err
				}
				req.Conn = args[0]
			}
			p, err := sock()
			if err != nil {
				return err
			}
			r, err := vnatd.Ask(p, req)
			if err != nil {
				return err
			}
			if actOutput == jsonOutput {
				return printJSON(cmd.OutOrStdout(), r)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%d connection(s) suspended\n", r.Count)
			return nil
		},
	}
	addOutputFlag(suspend.Flags(), &actOutput)
	suspend.Flags().BoolVar(&all, "all", false, "every active connection")
	suspend.Flags().StringVar(&conflict, "conflict", "", "these connections' policy for a virtual-identification conflict (§3.4.2): abort or preempt (default: the daemon's --conflict)")

	resume := &cobra.Command{
		Use:   "resume",
		Short: "Look again for the peers of connections still suspended or locating",
		Long: `A move restores connections by itself (the daemon watches the address). A
connection whose peer was nowhere to be found waits suspended, its location
stored; resume walks the locate order again for those.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := sock()
			if err != nil {
				return err
			}
			r, err := vnatd.Ask(p, vnatd.Request{Op: "resume"})
			if err != nil {
				return err
			}
			if actOutput == jsonOutput {
				return printJSON(cmd.OutOrStdout(), r)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%d connection(s) resumed\n", r.Count)
			return nil
		},
	}
	addOutputFlag(resume.Flags(), &actOutput)
	stop := &cobra.Command{
		Use:   "stop",
		Short: "Stop this endpoint's VNAT daemon and remove its translations and pins",
		Long: `Asks the daemon of this network namespace to stop for good: it stops its
helpers (thaws a frozen cgroup), detaches the programs, removes its routes,
unpins its maps and links and exits; migrated connections stop being
translated. A daemon ended by a signal instead leaves its translations pinned
for the next ` + "`onehop vnat run`" + `.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := sock()
			if err != nil {
				return err
			}
			r, err := vnatd.Ask(p, vnatd.Request{Op: "stop"})
			if err != nil {
				return err
			}
			if actOutput == jsonOutput {
				return printJSON(cmd.OutOrStdout(), r)
			}
			fmt.Fprintln(cmd.OutOrStdout(), "vnat daemon stopping; translations and pins removed")
			return nil
		},
	}
	addOutputFlag(stop.Flags(), &actOutput)
	v.AddCommand(run, status, suspend, resume, stop)
	return v
}

func printVNATStatus(w io.Writer, r vnatd.Reply, output outputFormat) error {
	if output == jsonOutput {
		return printJSON(w, r)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PROTO\tVIRTUAL\tPHYSICAL\tSTATE\tROLE\tKEYED\tCONFLICT")
	for _, c := range r.Conns {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%v\t%s\n", c.Proto, c.Virtual, c.Physical, c.State, c.Role, c.Keyed, c.Conflict)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(r.Counters) > 0 {
		keys := make([]string, 0, len(r.Counters))
		for k := range r.Counters {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		fmt.Fprint(w, "counters:")
		for _, k := range keys {
			fmt.Fprintf(w, " %s=%d", k, r.Counters[k])
		}
		fmt.Fprintln(w)
	}
	if r.Restore != nil {
		fmt.Fprintln(w, r.Restore)
	}
	return nil
}
