package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strconv"
	"time"

	"github.com/google/gopacket/pcapgo"
	"github.com/spf13/cobra"

	"github.com/onehop/onehop/internal/controller"
	"github.com/onehop/onehop/internal/tappolicy"
	"github.com/onehop/onehop/internal/tapwire"
)

func tapCaptureCmd() *cobra.Command {
	var file string
	var count int
	var duration time.Duration
	cmd := &cobra.Command{
		Use:   "capture NAME -w FILE.pcap [--count N] [--duration D]",
		Short: "Write a TAP policy's copies to a pcap file, without a monitor VM",
		Long: `While it runs, the hosts of the policy's senders also copy what it matches to
the controller (ERSPAN to its address on the fabric, paced by the same
per-monitor share as every copy), and the controller streams them here: FILE
is a pcap file of the copied frames, as the receiver sees them, that tshark,
tcpdump and Wireshark read (-w - writes to stdout). It stops after --count
packets, after --duration, or on ctrl-c; then the hosts stop copying to the
controller. One capture of a policy at a time.`,
		Example: `  onehop tap capture web-http -w /tmp/web.pcap --count 100
  onehop tap capture web-http -w /tmp/web.pcap --duration 30s
  onehop tap capture web-http -w - | tshark -r - -Y http.request`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if err := tappolicy.CheckName(name); err != nil {
				return fmt.Errorf("NAME: %w", err)
			}
			switch {
			case file == "":
				return errors.New("-w FILE is required: the pcap file to write (- for stdout)")
			case count < 0:
				return fmt.Errorf("--count %d: want a number of packets, 0 (no limit) or more", count)
			case duration < 0 || duration > controller.MaxCaptureDuration:
				return fmt.Errorf("--duration %s: want 0 (up to %s) to %s", duration, controller.MaxCaptureDuration, controller.MaxCaptureDuration)
			}
			c, err := api()
			if err != nil {
				return err
			}
			var v controller.TapView
			if err := c.Do("GET", "/v1/taps/"+name, nil, &v); err != nil {
				return fmt.Errorf("tap %s: %w", name, err)
			}
			out := io.Writer(cmd.OutOrStdout())
			if file != "-" {
				f, err := os.OpenFile(file, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
				if err != nil {
					return fmt.Errorf("-w %s: %w", file, err)
				}
				defer f.Close()
				out = f
			}
			ctx, stop := signalContext()
			defer stop()
			q := url.Values{}
			if count > 0 {
				q.Set("count", strconv.Itoa(count))
			}
			if duration > 0 {
				q.Set("duration", duration.String())
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, duration+10*time.Second) // the controller ends it; this, if it does not
				defer cancel()
			}
			body, err := c.Stream(ctx, "/v1/taps/"+name+"/capture?"+q.Encode())
			if err != nil {
				return fmt.Errorf("capture of tap %s: %w", name, err)
			}
			defer body.Close()
			n, err := copyPcap(out, body, func() {
				fmt.Fprintf(cmd.ErrOrStderr(), "capturing tap %s (%s) to %s\n", name, describeTap(v), file)
			})
			fmt.Fprintf(cmd.ErrOrStderr(), "%d packets captured to %s\n", n, file)
			if err != nil && ctx.Err() == nil {
				return fmt.Errorf("capture of tap %s: %w", name, err)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVarP(&file, "write", "w", "", "the pcap file to write (- for stdout)")
	f.IntVar(&count, "count", 0, "stop after this many packets (0: no limit)")
	f.DurationVar(&duration, "duration", 0, "stop after this long (0: until ctrl-c, at most 1h)")
	return cmd
}

// copyPcap copies a pcap stream record by record, so that what is written
// is a whole file whenever it stops; started is called once the stream's
// header has come (the capture runs). It returns the packets copied.
func copyPcap(w io.Writer, r io.Reader, started func()) (int, error) {
	in, err := pcapgo.NewReader(r)
	if err != nil {
		return 0, fmt.Errorf("read the capture's header: %w", err)
	}
	out := pcapgo.NewWriter(w)
	if err := out.WriteFileHeader(tapwire.Snaplen, in.LinkType()); err != nil {
		return 0, err
	}
	started()
	n := 0
	for {
		data, ci, err := in.ReadPacketData()
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
		if err := out.WritePacket(ci, data); err != nil {
			return n, err
		}
		n++
	}
}
