package agent

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"
)

// ServeSlowPath answers what the datapath hands over (DHCP requests) until
// the reader is closed. Replies go out through a packet socket that only
// sends: it receives nothing, so it costs other traffic nothing.
func ServeSlowPath(r *ringbuf.Reader, dhcpd *DHCPServer, log *slog.Logger) {
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		log.Error("no packet socket: DHCP will not be answered", "err", err)
		return
	}
	defer unix.Close(fd)
	for {
		rec, err := r.Read()
		if errors.Is(err, ringbuf.ErrClosed) {
			return
		}
		if err != nil {
			log.Warn("read slow path", "err", err)
			continue
		}
		ifindex, frame, err := decodeSlowPath(rec.RawSample)
		if err != nil {
			log.Warn("slow path record", "err", err)
			continue
		}
		reply, err := dhcpd.Handle(ifindex, frame)
		if err != nil {
			log.Warn("DHCP request not answered", "err", err)
			continue
		}
		if reply == nil {
			continue
		}
		to := &unix.SockaddrLinklayer{Ifindex: ifindex, Halen: 6}
		copy(to.Addr[:], reply[0:6])
		if err := unix.Sendto(fd, reply, 0, to); err != nil {
			log.Warn("send DHCP reply", "ifindex", ifindex, "err", err)
			continue
		}
		vm, _ := dhcpd.Local(ifindex)
		log.Info("answered DHCP", "vm", vm.Name, "ip", vm.IP)
	}
}

// decodeSlowPath splits a struct slowpath_event (bpf/lib/common.h).
func decodeSlowPath(b []byte) (int, []byte, error) {
	if len(b) < 8 {
		return 0, nil, fmt.Errorf("%d-byte record", len(b))
	}
	ifindex := int(uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24)
	n := int(uint32(b[4]) | uint32(b[5])<<8 | uint32(b[6])<<16 | uint32(b[7])<<24)
	if n > len(b)-8 {
		return 0, nil, fmt.Errorf("record claims %d bytes, holds %d", n, len(b)-8)
	}
	return ifindex, b[8 : 8+n], nil
}
