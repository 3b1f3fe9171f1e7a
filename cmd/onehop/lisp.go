package main

import (
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/onehop/onehop/internal/controller"
	"github.com/onehop/onehop/internal/lisp"
)

const lispLong = `LISP (RFC 9300/9301) separates who a host is, its EID, from where it can be
reached, its RLOCs. The controller runs the map-server and map-resolver (UDP
4342, onehop controller --lisp-listen): it answers Map-Requests from the
mappings it holds in etcd, EID prefix -> RLOCs. Mappings come from two places:
  - operators: onehop lisp map add (kept until deleted);
  - xTRs: authenticated Map-Registers (HMAC-SHA-256-128 with their site's key,
    --lisp-site-keys), refreshed every minute and dropped 3 minutes after the
    last refresh.
An EID no mapping covers gets a negative reply: "not LISP, forward natively".

Each RLOC has a priority (lower is preferred; 255 = never for unicast) and a
weight (the share among RLOCs of equal priority). The multipath gateway opens
one MPTCP subflow per usable RLOC. docs/cloud-access.md has the details.`

func lispCmd() *cobra.Command {
	c := &cobra.Command{Use: "lisp", Short: "LISP mapping system: what the controller's map-server holds", Long: lispLong,
		Example: `  onehop lisp map add 10.99.0.0/16 --rloc 192.168.100.11,1,50 --rloc 192.168.100.12,1,50
  onehop lisp map list
  onehop lisp map delete 10.99.0.0/16
  onehop lisp server`}
	m := &cobra.Command{Use: "map", Short: "Add, list and delete EID-to-RLOC mappings", Long: lispLong,
		Example: `  onehop lisp map add 10.99.0.0/16 --rloc 192.168.100.11 --rloc 192.168.100.12,2,100
  onehop lisp map list -o json
  onehop lisp map delete 10.99.0.0/16`}
	m.AddCommand(lispMapAddCmd(), lispMapListCmd(), lispMapDeleteCmd())
	c.AddCommand(m, lispServerCmd())
	return c
}

// parseRLOC reads ADDR[,PRIORITY[,WEIGHT]].
func parseRLOC(s string) (controller.LISPLocatorBody, error) {
	parts := strings.Split(s, ",")
	if len(parts) > 3 {
		return controller.LISPLocatorBody{}, fmt.Errorf("--rloc %q: want ADDR[,PRIORITY[,WEIGHT]], e.g. 192.168.100.11,1,50", s)
	}
	a, err := netip.ParseAddr(parts[0])
	if err != nil {
		return controller.LISPLocatorBody{}, fmt.Errorf("--rloc %q: %q is not an IP address", s, parts[0])
	}
	l := controller.LISPLocatorBody{Addr: a.String()}
	for i, name := range []string{"priority", "weight"} {
		if len(parts) <= i+1 {
			break
		}
		v, err := strconv.Atoi(parts[i+1])
		if err != nil || v < 0 || v > 255 {
			return l, fmt.Errorf("--rloc %q: %s %q: want 0-255", s, name, parts[i+1])
		}
		if i == 0 {
			l.Priority = &v
		} else {
			l.Weight = &v
		}
	}
	return l, nil
}

func lispMapAddCmd() *cobra.Command {
	var rlocs []string
	var ttl int64
	var action string
	cmd := &cobra.Command{
		Use:   "add EID-PREFIX --rloc ADDR[,PRIORITY[,WEIGHT]] ... [--ttl MINUTES] [--action A]",
		Short: "Add an operator's mapping of an EID prefix to its RLOCs",
		Long: lispLong + `

--rloc is repeated, one per RLOC. PRIORITY defaults to 1 and WEIGHT to 100.
With no --rloc the mapping is negative and --action says what ITRs do
(default native-forward; also drop, drop-policy-denied, send-map-request).
--ttl is how long askers may cache the answer, in minutes (default 1440).`,
		Example: `  # a data center reachable over two WAN paths, equally:
  onehop lisp map add 10.99.0.0/16 --rloc 192.168.100.11,1,50 --rloc 192.168.100.12,1,50
  # prefer the first path; the second only when it fails:
  onehop lisp map add 10.98.0.0/24 --rloc 192.168.100.11,1 --rloc 192.168.100.12,2
  # keep an RLOC listed but never use it for unicast:
  onehop lisp map add 10.97.0.0/24 --rloc 192.168.100.11 --rloc 192.168.100.13,255
  # a prefix that is not LISP: forward natively, cache for 15 minutes:
  onehop lisp map add 10.96.0.0/16 --ttl 15`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := netip.ParsePrefix(args[0])
			if err != nil {
				return fmt.Errorf("EID-PREFIX %q: want a prefix such as 10.99.0.0/16", args[0])
			}
			if p.Masked() != p {
				return fmt.Errorf("EID-PREFIX %s has host bits set: did you mean %s?", p, p.Masked())
			}
			body := controller.LISPMappingBody{EID: p.String(), Action: action, Locators: []controller.LISPLocatorBody{}}
			if cmd.Flags().Changed("ttl") {
				if ttl < 0 || ttl > 0xffffffff {
					return fmt.Errorf("--ttl %d: want 0 to 4294967295 minutes", ttl)
				}
				body.TTLMinutes = &ttl
			}
			if action != "" {
				if _, err := lisp.ParseAction(action); err != nil {
					return fmt.Errorf("--action: %w", err)
				}
			}
			for _, r := range rlocs {
				l, err := parseRLOC(r)
				if err != nil {
					return err
				}
				body.Locators = append(body.Locators, l)
			}
			c, err := api()
			if err != nil {
				return err
			}
			var m controller.LISPMapping
			if err := c.Do("POST", "/v1/lisp/mappings", body, &m); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "mapping %s: %s\n", m.EID, describeMapping(m))
			return nil
		},
	}
	cmd.Flags().StringArrayVar(&rlocs, "rloc", nil, "an RLOC: ADDR[,PRIORITY[,WEIGHT]] (repeat for each)")
	cmd.Flags().Int64Var(&ttl, "ttl", controller.DefaultLISPTTLMinutes, "record TTL in minutes")
	cmd.Flags().StringVar(&action, "action", "", "what ITRs do without a usable RLOC: no-action, native-forward, send-map-request, drop, drop-policy-denied, drop-auth-failure")
	return cmd
}

// describeMapping is a mapping in a line.
func describeMapping(m controller.LISPMapping) string {
	var rl []string
	for _, l := range m.Locators {
		rl = append(rl, fmt.Sprintf("%s (priority %d, weight %d)", l.Addr, l.Priority, l.Weight))
	}
	out := "negative, " + m.Action
	if len(rl) > 0 {
		out = strings.Join(rl, ", ")
	}
	return fmt.Sprintf("%s; ttl %d min", out, m.TTLMinutes)
}

func lispMapListCmd() *cobra.Command {
	var output outputFormat
	cmd := &cobra.Command{
		Use: "list [-o json]", Short: "List the mappings the map-server answers with: operators' and registered", Args: cobra.NoArgs,
		Example: "  onehop lisp map list\n  onehop lisp map list -o json",
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := api()
			if err != nil {
				return err
			}
			var items []controller.LISPMapping
			if err := c.Do("GET", "/v1/lisp/mappings", nil, &items); err != nil {
				return err
			}
			return printMappings(cmd.OutOrStdout(), output, items)
		},
	}
	addOutputFlag(cmd.Flags(), &output)
	return cmd
}

func printMappings(out io.Writer, output outputFormat, items []controller.LISPMapping) error {
	if output == jsonOutput {
		return printJSON(out, items)
	}
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	defer w.Flush()
	fmt.Fprintln(w, "EID\tRLOCS (PRIORITY/WEIGHT)\tACTION\tTTL\tSOURCE\tEXPIRES")
	for _, m := range items {
		var rl []string
		for _, l := range m.Locators {
			rl = append(rl, fmt.Sprintf("%s/%d/%d", l.Addr, l.Priority, l.Weight))
		}
		rlocs := strings.Join(rl, " ")
		if rlocs == "" {
			rlocs = "-"
		}
		src, exp := m.Source, "-"
		if m.Site != "" {
			src += " (" + m.Site + ")"
		}
		if !m.Expires.IsZero() {
			exp = m.Expires.Format("15:04:05")
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%dm\t%s\t%s\n", m.EID, rlocs, m.Action, m.TTLMinutes, src, exp)
	}
	return nil
}

func lispMapDeleteCmd() *cobra.Command {
	return &cobra.Command{
		Use: "delete EID-PREFIX", Short: "Delete the mapping of exactly this EID prefix", Args: cobra.ExactArgs(1),
		Long: `Deletes an operator's mapping or a registration. A site that still
registers the prefix puts it back at its next Map-Register (within a minute).`,
		Example: "  onehop lisp map delete 10.99.0.0/16",
		RunE: func(cmd *cobra.Command, args []string) error {
			p, err := netip.ParsePrefix(args[0])
			if err != nil {
				return fmt.Errorf("EID-PREFIX %q: want a prefix such as 10.99.0.0/16", args[0])
			}
			c, err := api()
			if err != nil {
				return err
			}
			if err := c.Do("DELETE", "/v1/lisp/mappings/"+p.String(), nil, nil); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "mapping %s deleted\n", p)
			return nil
		},
	}
}

func lispServerCmd() *cobra.Command {
	var output outputFormat
	cmd := &cobra.Command{
		Use: "server [-o json]", Short: "The map-server's address and counters, refused Map-Registers by reason", Args: cobra.NoArgs,
		Example: "  onehop lisp server\n  onehop lisp server -o json",
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := api()
			if err != nil {
				return err
			}
			var st controller.LISPServerStats
			if err := c.Do("GET", "/v1/lisp/server", nil, &st); err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if output == jsonOutput {
				return printJSON(out, st)
			}
			if st.Listen == "" {
				fmt.Fprintln(out, "no map-server runs (onehop controller --lisp-listen ADDR:4342 starts one)")
				return nil
			}
			fmt.Fprintf(out, "map-server on %s, %d sites\n", st.Listen, st.Sites)
			fmt.Fprintf(out, "map-requests answered %d (negative %d), refused datagrams %d\n", st.Requests, st.NegativeReplies, st.RequestsRefused)
			fmt.Fprintf(out, "map-requests rate-limited %d, replies sent to the sender, not a third-party ITR-RLOC (larger than the request) %d\n", st.RequestsRateLimited, st.RepliesToSource)
			fmt.Fprintf(out, "map-registers accepted %d, map-notifies sent %d, registrations expired %d\n", st.Registers, st.Notifies, st.Expired)
			for _, reason := range []string{"malformed", "unauthenticated", "unsupported-algorithm", "unknown-site", "bad-auth", "replayed-nonce", "operator-mapping", "store-error"} {
				if n := st.RegistersRefused[reason]; n > 0 {
					fmt.Fprintf(out, "map-registers refused, %s: %d\n", reason, n)
				}
			}
			return nil
		},
	}
	addOutputFlag(cmd.Flags(), &output)
	return cmd
}
