package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"time"

	"github.com/spf13/cobra"

	"github.com/onehop/onehop/internal/controller"
	"github.com/onehop/onehop/internal/observe"
)

func observeCmd() *cobra.Command {
	var output outputFormat
	var farm, vm, node, reason string
	var follow bool
	c := &cobra.Command{
		Use:   "observe [--farm F] [--vm FARM/SUBNET/VM] [--node H] [--reason R] [--follow] [-o json]",
		Short: "A live stream of the datapath's events: drops with reason and addresses, admitted flows, lost counts",
		Long: `The hosts' datapath events, as they happen: every dropped packet with its
reason (the drop counters' names, as onehop stats shows them), addresses,
ports and interface, and, while a stream runs, every new flow admitted. A
"lost N events" line says how many of a farm's events could not be shown
and where: over the farm's budget in the datapath (1000 events a second
and CPU per farm, bursts of 256, on each host), the agent's queue, or the
network. One farm's flood spends its own budget: another farm's events
still show. A tenant's credential sees its own farm's events only.

Without --follow it shows the hosts' last events (up to 128 each) and
what comes within 2 s; with --follow it streams until ctrl-c (1h at most).`,
		Example: `  onehop observe --follow
  onehop observe --farm blue --reason spoofed_ip --follow -o json
  onehop observe --vm blue/web/web1 --follow`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := api()
			if err != nil {
				return err
			}
			q := url.Values{}
			for k, v := range map[string]string{"farm": farm, "vm": vm, "node": node, "reason": reason} {
				if v != "" {
					q.Set(k, v)
				}
			}
			ctx, stop := signalContext()
			defer stop()
			if follow {
				q.Set("follow", "true")
			} else {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, controller.ObserveWindow+10*time.Second) // the controller ends it; this, if it does not
				defer cancel()
			}
			body, err := c.Stream(ctx, "/v1/observe?"+q.Encode())
			if err != nil {
				return fmt.Errorf("observe: %w", err)
			}
			defer body.Close()
			// The stream's record is stored: the hosts publish from now.
			fmt.Fprintln(cmd.ErrOrStderr(), "observing")
			out := cmd.OutOrStdout()
			sc := bufio.NewScanner(body)
			sc.Buffer(make([]byte, 64<<10), 1<<20)
			for sc.Scan() {
				if output == jsonOutput {
					fmt.Fprintln(out, sc.Text())
					continue
				}
				var e observe.Event
				if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
					return fmt.Errorf("observe: event from the controller: %w", err)
				}
				fmt.Fprintln(out, observe.Line(e))
			}
			if err := sc.Err(); err != nil && ctx.Err() == nil {
				return fmt.Errorf("observe: %w", err)
			}
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&farm, "farm", "", "only this farm's events")
	f.StringVar(&vm, "vm", "", "only events from or to this VM (farm/subnet/vm)")
	f.StringVar(&node, "node", "", "only this host's events")
	f.StringVar(&reason, "reason", "", "only drops of this reason (spoofed_ip, not_visible, ...)")
	f.BoolVarP(&follow, "follow", "f", false, "stream until ctrl-c")
	addOutputFlag(f, &output)
	return c
}
