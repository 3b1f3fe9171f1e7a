package agent

import (
	"bytes"
	"encoding/binary"
	"errors"
	"log/slog"
	"net"
	"time"

	"github.com/cilium/ebpf/ringbuf"

	"github.com/onehop/onehop/internal/datapath"
)

// LogDrops logs each drop the datapath reports, so an operator can see which
// VM sent what and why it was refused. At most burst lines per second are
// written; the rest are summed into one line, and the counters stay exact.
func LogDrops(r *ringbuf.Reader, name func(reason uint32) string, ifname func(int) string, log *slog.Logger, burst int) {
	var (
		windowStart = time.Now()
		inWindow    int
		suppressed  int
	)
	for {
		rec, err := r.Read()
		if errors.Is(err, ringbuf.ErrClosed) {
			return
		}
		if err != nil {
			log.Warn("read drop events", "err", err)
			continue
		}
		var ev datapath.DropEvent
		if err := binary.Read(bytes.NewReader(rec.RawSample), binary.NativeEndian, &ev); err != nil {
			continue
		}
		now := time.Now()
		if now.Sub(windowStart) >= time.Second {
			if suppressed > 0 {
				log.Warn("more packets dropped; see onehop_dropped_packets_total", "unlogged", suppressed)
			}
			windowStart, inWindow, suppressed = now, 0, 0
		}
		if inWindow >= burst {
			suppressed++
			continue
		}
		inWindow++
		log.Warn("dropped packet",
			"reason", name(ev.Reason),
			"interface", ifname(int(ev.Ifindex)),
			"src_mac", net.HardwareAddr(ev.Smac[:]).String(),
			"ethertype", ev.Ethertype,
			"src", datapath.KeyIP(ev.Saddr).String(),
			"dst", datapath.KeyIP(ev.Daddr).String())
	}
}
