package agent

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"

	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/internal/arpengine"
	"github.com/onehop/onehop/internal/datapath"
	"github.com/onehop/onehop/internal/ratelog"
)

// PacketSocket sends frames; it receives nothing, so it costs other traffic
// nothing. Frames for a guest go by a second socket whose frames carry
// datapath.GuestMark: out of a macvtap, where the vif program sits, only
// the mark tells the agent's answer from the guest's own frames (the
// program hands it into the guest); on a veth or a tap the mark is
// harmless (a veth clears it between namespaces).
type PacketSocket struct{ fd, guest int }

// OpenPacketSocket opens the send-only packet sockets.
func OpenPacketSocket() (*PacketSocket, error) {
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("packet socket: %w", err)
	}
	guest, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("packet socket: %w", err)
	}
	if err := unix.SetsockoptInt(guest, unix.SOL_SOCKET, unix.SO_MARK, int(datapath.GuestMark)); err != nil {
		unix.Close(fd)
		unix.Close(guest)
		return nil, fmt.Errorf("packet socket for guests: mark %#x: %w", datapath.GuestMark, err)
	}
	return &PacketSocket{fd: fd, guest: guest}, nil
}

// Send puts an Ethernet frame on the interface with this ifindex.
func (p *PacketSocket) Send(ifindex int, frame []byte) error {
	return sendFrame(p.fd, ifindex, frame)
}

// SendToGuest hands an Ethernet frame to the guest behind the vif with this
// ifindex, whatever its kind.
func (p *PacketSocket) SendToGuest(ifindex int, frame []byte) error {
	return sendFrame(p.guest, ifindex, frame)
}

func sendFrame(fd, ifindex int, frame []byte) error {
	if len(frame) < 14 {
		return fmt.Errorf("%d-byte frame", len(frame))
	}
	to := &unix.SockaddrLinklayer{Ifindex: ifindex, Halen: 6}
	copy(to.Addr[:], frame[0:6])
	return unix.Sendto(fd, frame, 0, to)
}

// Close closes the sockets.
func (p *PacketSocket) Close() error {
	return errors.Join(unix.Close(p.fd), unix.Close(p.guest))
}

// SlowPath is the agent's side of what the datapath hands over. Every log
// line a VM can cause goes through Log, rate-limited per VM and event, and
// each VM's DHCP requests draw on its own share, so a VM that floods cannot
// fill the disk or take the slow path away from the others.
type SlowPath struct {
	Sock   *PacketSocket
	DHCP   *DHCPServer
	ARP    *arpengine.Engine
	Claims *ClaimChecker
	Shares *Shares
	Log    *ratelog.Logger
}

// Serve handles records until the reader is closed: DHCP requests are
// answered, held packets and ARP answers go to the ARP engine, hosts'
// claims to the claim checker.
func (s *SlowPath) Serve(r *ringbuf.Reader, log *slog.Logger) {
	for {
		rec, err := r.Read()
		if errors.Is(err, ringbuf.ErrClosed) {
			return
		}
		if err != nil {
			s.Log.Warn("read", "read slow path", "err", err)
			continue
		}
		ev, err := decodeSlowPath(rec.RawSample)
		if err != nil {
			s.Log.Warn("record", "slow path record", "err", err)
			continue
		}
		switch ev.kind {
		case datapath.SlowHold:
			if err := s.ARP.Hold(ev.frame, ev.origLen); err != nil {
				s.Log.Warn(fmt.Sprintf("hold/%d", ev.ifindex), "held packet", "ifindex", ev.ifindex, "err", err)
			}
		case datapath.SlowARPReply:
			a, err := arpengine.ParseAnswer(ev.frame)
			if err != nil {
				s.Log.Warn("arp-answer", "ARP answer", "err", err)
				continue
			}
			s.ARP.Answered(a)
		case datapath.SlowMappingClaim:
			// An announcement or an answer: both name the VM as sender.
			a, err := arpengine.ParseAnswer(ev.frame)
			if err != nil {
				s.Log.Warn("claim", "mapping claim", "err", err)
				continue
			}
			s.Claims.Claim(a)
		case datapath.SlowDHCP:
			s.answerDHCP(ev.ifindex, ev.frame, log)
		default:
			s.Log.Warn("kind", "slow path record of unknown kind", "kind", ev.kind)
		}
	}
}

func (s *SlowPath) answerDHCP(ifindex int, frame []byte, log *slog.Logger) {
	key := fmt.Sprintf("dhcp/%d", ifindex)
	vm, known := s.DHCP.Local(ifindex)
	if known && !s.Shares.Allow(vm.Name, "dhcp") {
		s.Log.Warn(key, "DHCP request refused: the VM is over its share", "vm", vm.Name,
			"share_per_second", DHCPPerSecond)
		return
	}
	reply, err := s.DHCP.Handle(ifindex, frame)
	if err != nil {
		s.Log.Warn(key, "DHCP request not answered", "err", err)
		return
	}
	if reply == nil {
		return
	}
	if err := s.Sock.SendToGuest(ifindex, reply); err != nil {
		s.Log.Warn(key, "send DHCP reply", "ifindex", ifindex, "err", err)
		return
	}
	s.Log.Info(key, "answered DHCP", "vm", vm.Name, "ip", vm.IP)
}

type slowPathEvent struct {
	kind             datapath.SlowpathKind
	ifindex, origLen int
	frame            []byte
}

// decodeSlowPath reads a struct slowpath_event (bpf/lib/common.h) into its
// generated Go twin: no offset is written twice.
func decodeSlowPath(b []byte) (slowPathEvent, error) {
	var rec datapath.SlowpathEvent
	if err := binary.Read(bytes.NewReader(b), binary.NativeEndian, &rec); err != nil {
		return slowPathEvent{}, fmt.Errorf("%d-byte record: %w", len(b), err)
	}
	n := int(rec.Len)
	if n > len(rec.Data) {
		return slowPathEvent{}, fmt.Errorf("record claims %d bytes, holds %d", n, len(rec.Data))
	}
	if int(rec.OrigLen) < n {
		return slowPathEvent{}, fmt.Errorf("record holds %d bytes of a %d-byte frame", n, rec.OrigLen)
	}
	return slowPathEvent{kind: datapath.SlowpathKind(rec.Kind), ifindex: int(rec.Ifindex), origLen: int(rec.OrigLen),
		frame: rec.Data[:n:n]}, nil
}
