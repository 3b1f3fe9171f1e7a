package vnat

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// ErrDestroyUnsupported is DestroySocket's error when the kernel cannot
// close another process's socket: built without CONFIG_INET_DIAG_DESTROY
// (SOCK_DESTROY answers EOPNOTSUPP), or without the protocol's sock_diag
// handler's destroy (an old udp_diag).
var ErrDestroyUnsupported = errors.New("the kernel cannot close sockets through sock_diag (needs CONFIG_INET_DIAG_DESTROY, and inet_diag/tcp_diag/udp_diag)")

// DestroySocket closes the endpoint's socket whose own tuple is t, as
// `ss -K` does (netlink sock_diag SOCK_DESTROY): the kernel aborts it, so
// the application's next read or write fails with ECONNABORTED (a TCP
// socket also sends a RESET). It is how a connection preempted in a
// virtual-identification conflict (paper §3.4.2) is closed for real: its
// packets belong to another connection now, and left alone its socket
// would linger until its own timers gave up. Needs CAP_NET_ADMIN; a kernel
// that cannot do it answers ErrDestroyUnsupported, a socket that is not
// there any more unix.ENOENT.
func (d *Datapath) DestroySocket(t Tuple) error {
	if err := validate(t); err != nil {
		return fmt.Errorf("vnat: destroy socket: %w", err)
	}
	err := d.inNS(func() error {
		req := nl.NewNetlinkRequest(nl.SOCK_DESTROY, unix.NLM_F_ACK)
		req.AddData(destroyRequest{t})
		_, err := req.Execute(unix.NETLINK_INET_DIAG, 0)
		return err
	})
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.EOPNOTSUPP):
		// inet_diag_cmd_exact: the protocol's handler has no destroy
		// (CONFIG_INET_DIAG_DESTROY off, or an old udp_diag).
		return fmt.Errorf("vnat: destroy socket %s: %w: %w", t, ErrDestroyUnsupported, err)
	case errors.Is(err, unix.ENOENT):
		return fmt.Errorf("vnat: destroy socket %s: no such socket: %w", t, err)
	}
	return fmt.Errorf("vnat: destroy socket %s: %w", t, err)
}

// destroyRequest is the SOCK_DESTROY request for one socket: struct
// inet_diag_req_v2 (include/uapi/linux/inet_diag.h) naming the socket by
// its tuple, any cookie.
type destroyRequest struct{ t Tuple }

// destroyRequestLen is sizeof(struct inet_diag_req_v2).
const destroyRequestLen = 56

func (destroyRequest) Len() int { return destroyRequestLen }

func (r destroyRequest) Serialize() []byte {
	b := make([]byte, destroyRequestLen)
	b[0] = unix.AF_INET
	b[1] = byte(r.t.Proto)
	// b[2] extensions, b[3] pad: 0.
	binary.NativeEndian.PutUint32(b[4:], ^uint32(0)) // every state
	// struct inet_diag_sockid: ports and addresses in network order.
	binary.BigEndian.PutUint16(b[8:], r.t.Local.Port())
	binary.BigEndian.PutUint16(b[10:], r.t.Remote.Port())
	src, dst := r.t.Local.Addr().As4(), r.t.Remote.Addr().As4()
	copy(b[12:], src[:])
	copy(b[28:], dst[:])
	// idiag_if (b[44:48]) 0: any interface. The cookie: none.
	binary.NativeEndian.PutUint32(b[48:], nl.TCPDIAG_NOCOOKIE)
	binary.NativeEndian.PutUint32(b[52:], nl.TCPDIAG_NOCOOKIE)
	return b
}
