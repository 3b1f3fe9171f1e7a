package agent

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"

	"github.com/cilium/ebpf/ringbuf"

	"github.com/onehop/onehop/internal/datapath"
	"github.com/onehop/onehop/internal/ratelog"
)

// LogDrops logs each drop the datapath reports, so an operator can see which
// VM sent what and why it was refused. Lines are budgeted per interface and
// source subnet: a VM that floods drops exhausts its own budget, never the
// lines about other tenants; the counters stay exact.
func LogDrops(r *ringbuf.Reader, name func(reason uint32) string, ifname func(int) string, rl *ratelog.Logger) {
	for {
		rec, err := r.Read()
		if errors.Is(err, ringbuf.ErrClosed) {
			return
		}
		if err != nil {
			rl.Warn("read", "read drop events", "err", err)
			continue
		}
		var ev datapath.DropEvent
		if err := binary.Read(bytes.NewReader(rec.RawSample), binary.NativeEndian, &ev); err != nil {
			rl.Warn("decode", "drop event record", "bytes", len(rec.RawSample), "err", err)
			continue
		}
		src := datapath.KeyIP(ev.Saddr)
		b := src.As4()
		rl.Warn(fmt.Sprintf("%d/%d.%d.%d", ev.Ifindex, b[0], b[1], b[2]), "dropped packet",
			"reason", name(ev.Reason),
			"interface", ifname(int(ev.Ifindex)),
			"src_mac", net.HardwareAddr(ev.Smac[:]).String(),
			"ethertype", ev.Ethertype,
			"src", src.String(),
			"dst", datapath.KeyIP(ev.Daddr).String())
	}
}
