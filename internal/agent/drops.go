package agent

import (
	"errors"
	"fmt"
	"math/bits"
	"net"
	"os"
	"time"

	"github.com/cilium/ebpf/ringbuf"

	"github.com/onehop/onehop/internal/datapath"
	"github.com/onehop/onehop/internal/observe"
	"github.com/onehop/onehop/internal/ratelog"
)

// LogDrops reads the datapath's events: it logs each drop, so an operator
// can see which VM sent what and why it was refused, and hands every event
// to obs (nil: none) for onehop observe. Lines are budgeted per interface
// and source subnet: a VM that floods drops exhausts its own budget, never
// the lines about other tenants; the counters stay exact.
func LogDrops(r *ringbuf.Reader, name func(reason uint32) string, ifname func(int) string, rl *ratelog.Logger, obs *Observer) {
	for {
		// The datapath wakes no reader for each record (observe.h):
		// what it submitted quietly is read at the deadline.
		r.SetDeadline(time.Now().Add(ObservePoll))
		rec, err := r.Read()
		if errors.Is(err, ringbuf.ErrClosed) {
			return
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			continue
		}
		if err != nil {
			rl.Warn("read", "read drop events", "err", err)
			continue
		}
		ev, err := datapath.DecodeObserveEvent(rec.RawSample)
		if err != nil {
			rl.Warn("decode", "drop event record", "err", err)
			continue
		}
		if obs != nil {
			obs.Publish(observeEvent(ev, name, ifname))
		}
		if ev.Kind != datapath.ObserveDrop {
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

// observeEvent is a datapath record as onehop observe shows it.
func observeEvent(ev datapath.ObserveEvent, name func(uint32) string, ifname func(int) string) observe.Event {
	e := observe.Event{
		Time:  time.Now(),
		Kind:  observe.KindFlow,
		Farm:  ev.Farm,
		Src:   datapath.KeyIP(ev.Saddr).String(),
		Dst:   datapath.KeyIP(ev.Daddr).String(),
		Proto: observe.ProtoName(ev.Proto),
		Sport: bits.ReverseBytes16(ev.Sport),
		Dport: bits.ReverseBytes16(ev.Dport),
	}
	if ev.Kind == datapath.ObserveDrop {
		e.Kind = observe.KindDrop
		e.Reason = name(ev.Reason)
		e.Interface = ifname(int(ev.Ifindex))
		if ev.Smac != [6]uint8{} {
			e.SrcMAC = net.HardwareAddr(ev.Smac[:]).String()
		}
	}
	return e
}
