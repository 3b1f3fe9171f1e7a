package gateway

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"syscall"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// The path manager's events (uapi linux/mptcp.h, MPTCP_PM_EV_GRP_NAME).
const (
	mptcpPMEventsGroup = "mptcp_pm_events"

	mptcpEventSubEstablished = 10
	mptcpEventSubClosed      = 11

	mptcpAttrToken       = 1
	mptcpAttrSaddr4      = 5
	mptcpAttrDaddr4      = 7
	mptcpAttrSport       = 9
	mptcpAttrDport       = 10
	mptcpAttrError       = 12
	mptcpAttrResetReason = 16
)

// SubflowEvent is the kernel telling what became of one subflow: joined
// (MPTCP_EVENT_SUB_ESTABLISHED) or closed (MPTCP_EVENT_SUB_CLOSED). It is
// how the gateway learns whether a join it asked for got an answer: the
// path manager's SUBFLOW_CREATE succeeds as soon as the SYN is sent.
type SubflowEvent struct {
	Token         uint32
	Local, Remote netip.AddrPort
	// Established is true for a subflow joined, false for one closed.
	Established bool
	// Err is the closed subflow's socket error (ECONNREFUSED: a plain
	// reset answered its SYN; ETIMEDOUT: no answer), 0 if none.
	Err syscall.Errno
	// Reset is set when the peer closed it with MP_TCPRST, whose reason
	// is ResetReason (RFC 8684 §3.6).
	Reset       bool
	ResetReason uint32
}

// parseSubflowEvent decodes one generic netlink message of the events
// group (cmd, then the attributes after the genl header); ok is false for
// events other than a subflow's.
func parseSubflowEvent(cmd uint8, attrs []byte) (SubflowEvent, bool, error) {
	if cmd != mptcpEventSubEstablished && cmd != mptcpEventSubClosed {
		return SubflowEvent{}, false, nil
	}
	as, err := nl.ParseRouteAttr(attrs)
	if err != nil {
		return SubflowEvent{}, false, fmt.Errorf("mptcp event %d: %w", cmd, err)
	}
	ev := SubflowEvent{Established: cmd == mptcpEventSubEstablished}
	var saddr, daddr netip.Addr
	var sport, dport uint16
	for _, a := range as {
		v := a.Value
		switch a.Attr.Type &^ (unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER) {
		case mptcpAttrToken:
			if len(v) >= 4 {
				ev.Token = binary.NativeEndian.Uint32(v)
			}
		case mptcpAttrSaddr4:
			if len(v) >= 4 {
				saddr = netip.AddrFrom4([4]byte(v[:4]))
			}
		case mptcpAttrDaddr4:
			if len(v) >= 4 {
				daddr = netip.AddrFrom4([4]byte(v[:4]))
			}
		case mptcpAttrSport:
			if len(v) >= 2 {
				sport = binary.BigEndian.Uint16(v)
			}
		case mptcpAttrDport:
			if len(v) >= 2 {
				dport = binary.BigEndian.Uint16(v)
			}
		case mptcpAttrError:
			if len(v) >= 1 {
				ev.Err = syscall.Errno(v[0])
			}
		case mptcpAttrResetReason:
			if len(v) >= 4 {
				ev.Reset, ev.ResetReason = true, binary.NativeEndian.Uint32(v)
			}
		}
	}
	if !saddr.IsValid() || !daddr.IsValid() {
		return SubflowEvent{}, false, nil /* IPv6: the gateway is IPv4 only */
	}
	ev.Local, ev.Remote = netip.AddrPortFrom(saddr, sport), netip.AddrPortFrom(daddr, dport)
	return ev, true, nil
}

// WatchSubflowEvents calls fn with every subflow event of the caller's
// network namespace until ctx ends. Events lost to a full socket buffer
// (ENOBUFS) are reported to lost and the watch goes on: a join whose
// answer was lost stays "join sent" in status.
func WatchSubflowEvents(ctx context.Context, fn func(SubflowEvent), lost func(error)) error {
	fam, err := netlink.GenlFamilyGet(mptcpPMName)
	if err != nil {
		return fmt.Errorf("mptcp events: generic netlink family %s: %w", mptcpPMName, err)
	}
	var group uint32
	for _, g := range fam.Groups {
		if g.Name == mptcpPMEventsGroup {
			group = g.ID
		}
	}
	if group == 0 {
		return fmt.Errorf("mptcp events: family %s has no group %s", mptcpPMName, mptcpPMEventsGroup)
	}
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_GENERIC)
	if err != nil {
		return fmt.Errorf("mptcp events: socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return fmt.Errorf("mptcp events: bind: %w", err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_ADD_MEMBERSHIP, int(group)); err != nil {
		unix.Close(fd)
		return fmt.Errorf("mptcp events: join group %s: %w", mptcpPMEventsGroup, err)
	}
	/* through the runtime's poller, so closing it ends a pending read */
	f := os.NewFile(uintptr(fd), "mptcp-events")
	go func() { <-ctx.Done(); f.Close() }()
	buf := make([]byte, 64<<10)
	for {
		n, err := f.Read(buf)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, unix.ENOBUFS) {
				lost(err)
				continue
			}
			return fmt.Errorf("mptcp events: read: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			lost(err)
			continue
		}
		for _, m := range msgs {
			if m.Header.Type != fam.ID || len(m.Data) < 4 {
				continue
			}
			ev, ok, err := parseSubflowEvent(m.Data[0], m.Data[4:])
			if err != nil {
				lost(err)
				continue
			}
			if ok {
				fn(ev)
			}
		}
	}
}
