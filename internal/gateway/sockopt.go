package gateway

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Socket options of an MPTCP socket (uapi linux/mptcp.h).
const (
	solMPTCP          = 284
	mptcpInfo         = 1
	mptcpTCPInfo      = 2
	mptcpSubflowAddrs = 3

	mptcpInfoFlagFallback = 1
)

// SubflowInfo is what the kernel says about one subflow of our own MPTCP
// socket (MPTCP_SUBFLOW_ADDRS and MPTCP_TCPINFO, in the same order).
type SubflowInfo struct {
	Local, Remote netip.AddrPort
	// BytesAcked is tcpi_bytes_acked: bytes sent on this subflow and acked.
	BytesAcked uint64
	// BytesReceived is tcpi_bytes_received.
	BytesReceived uint64
	// State is the TCP state (1 = established).
	State uint8
}

// MPTCPState is the connection-level view from MPTCP_INFO.
type MPTCPState struct {
	Token    uint32
	Fallback bool
}

func getsockopt(c syscall.Conn, level, opt int, buf []byte) (int, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	n := uint32(len(buf))
	var serr error
	if err := rc.Control(func(fd uintptr) {
		_, _, e := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, uintptr(level), uintptr(opt),
			uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&n)), 0)
		if e != 0 {
			serr = e
		}
	}); err != nil {
		return 0, err
	}
	return int(n), serr
}

// ReadMPTCPInfo reads MPTCP_INFO of c (an MPTCP socket).
func ReadMPTCPInfo(c *net.TCPConn) (MPTCPState, error) {
	buf := make([]byte, 64)
	n, err := getsockopt(c, solMPTCP, mptcpInfo, buf)
	if err != nil {
		return MPTCPState{}, fmt.Errorf("getsockopt MPTCP_INFO: %w", err)
	}
	if n < 16 {
		return MPTCPState{}, fmt.Errorf("getsockopt MPTCP_INFO: %d bytes, want 16 or more", n)
	}
	/* struct mptcp_info: six u8 counters, pad, u32 flags at 8, u32 token at 12 */
	flags := binary.NativeEndian.Uint32(buf[8:])
	return MPTCPState{Token: binary.NativeEndian.Uint32(buf[12:]), Fallback: flags&mptcpInfoFlagFallback != 0}, nil
}

const (
	subflowDataLen = 16  // struct mptcp_subflow_data
	subflowAddrLen = 256 // struct mptcp_subflow_addrs: two sockaddr_storage
)

// ReadSubflows lists c's subflows with their addresses and byte counts.
func ReadSubflows(c *net.TCPConn) ([]SubflowInfo, error) {
	addrs, err := subflowArray(c, mptcpSubflowAddrs, subflowAddrLen)
	if err != nil {
		return nil, fmt.Errorf("getsockopt MPTCP_SUBFLOW_ADDRS: %w", err)
	}
	tiLen := int(unsafe.Sizeof(unix.TCPInfo{}))
	infos, err := subflowArray(c, mptcpTCPInfo, tiLen)
	if err != nil {
		return nil, fmt.Errorf("getsockopt MPTCP_TCPINFO: %w", err)
	}
	/* both arrays walk the connection's subflow list; if it changed in
	   between, the counts differ and the shorter is what we can pair */
	n := min(len(addrs), len(infos))
	out := make([]SubflowInfo, 0, n)
	for i := 0; i < n; i++ {
		var ti unix.TCPInfo
		copy(unsafe.Slice((*byte)(unsafe.Pointer(&ti)), tiLen), infos[i])
		out = append(out, SubflowInfo{
			Local:         sockaddrIn(addrs[i][:128]),
			Remote:        sockaddrIn(addrs[i][128:]),
			BytesAcked:    ti.Bytes_acked,
			BytesReceived: ti.Bytes_received,
			State:         ti.State,
		})
	}
	return out, nil
}

// subflowArray reads one of the per-subflow arrays (struct
// mptcp_subflow_data followed by num_subflows elements of size_user).
func subflowArray(c *net.TCPConn, opt, elem int) ([][]byte, error) {
	buf := make([]byte, subflowDataLen+MaxPaths*2*elem)
	binary.NativeEndian.PutUint32(buf[0:], subflowDataLen)
	binary.NativeEndian.PutUint32(buf[12:], uint32(elem))
	n, err := getsockopt(c, solMPTCP, opt, buf)
	if err != nil {
		return nil, err
	}
	if n < subflowDataLen {
		return nil, fmt.Errorf("%d bytes, want %d or more", n, subflowDataLen)
	}
	num := int(binary.NativeEndian.Uint32(buf[4:]))
	size := int(binary.NativeEndian.Uint32(buf[12:]))
	var out [][]byte
	for i := 0; i < num; i++ {
		off := subflowDataLen + i*size
		if off+size > n {
			break
		}
		out = append(out, buf[off:off+size])
	}
	return out, nil
}

// sockaddrIn reads a struct sockaddr_in (family, big-endian port, address).
func sockaddrIn(b []byte) netip.AddrPort {
	if binary.NativeEndian.Uint16(b) != unix.AF_INET {
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[4:8])), binary.BigEndian.Uint16(b[2:4]))
}

// SetCongestion sets TCP_CONGESTION on a raw socket (from a Control hook).
func SetCongestion(fd uintptr, algo string) error {
	if err := unix.SetsockoptString(int(fd), unix.IPPROTO_TCP, unix.TCP_CONGESTION, algo); err != nil {
		return fmt.Errorf("setsockopt TCP_CONGESTION %s: %w", algo, err)
	}
	return nil
}

// Congestion reads a connected socket's TCP_CONGESTION.
func Congestion(c syscall.Conn) (string, error) {
	buf := make([]byte, 16)
	n, err := getsockopt(c, unix.IPPROTO_TCP, unix.TCP_CONGESTION, buf)
	if err != nil {
		return "", fmt.Errorf("getsockopt TCP_CONGESTION: %w", err)
	}
	s := string(buf[:n])
	for i, ch := range s {
		if ch == 0 {
			return s[:i], nil
		}
	}
	return s, nil
}

// ReadTCPInfo reads a plain (or fallen back) TCP socket's figures as one
// subflow.
func ReadTCPInfo(c *net.TCPConn) (SubflowInfo, error) {
	var ti unix.TCPInfo
	tiLen := int(unsafe.Sizeof(ti))
	buf := make([]byte, tiLen)
	if _, err := getsockopt(c, unix.IPPROTO_TCP, unix.TCP_INFO, buf); err != nil {
		return SubflowInfo{}, fmt.Errorf("getsockopt TCP_INFO: %w", err)
	}
	copy(unsafe.Slice((*byte)(unsafe.Pointer(&ti)), tiLen), buf)
	return SubflowInfo{
		Local:         c.LocalAddr().(*net.TCPAddr).AddrPort(),
		Remote:        c.RemoteAddr().(*net.TCPAddr).AddrPort(),
		BytesAcked:    ti.Bytes_acked,
		BytesReceived: ti.Bytes_received,
		State:         ti.State,
	}, nil
}
