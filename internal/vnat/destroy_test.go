package vnat

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/internal/netns"
)

// The request is struct inet_diag_req_v2 byte for byte: family, protocol,
// every state, the tuple in network order, no interface, the cookie.
func TestDestroyRequestIsInetDiagReqV2(t *testing.T) {
	tu := Tuple{Proto: UDP, Local: ap("10.9.0.1:4000"), Remote: ap("10.9.3.4:53")}
	got := destroyRequest{t: tu, cookie: [2]uint32{0x01020304, 0x0a0b0c0d}}.Serialize()
	want := make([]byte, 0, destroyRequestLen)
	want = append(want, unix.AF_INET, 17, 0, 0)
	want = binary.NativeEndian.AppendUint32(want, 0xffffffff)
	want = append(want, 0x0f, 0xa0, 0x00, 53)
	want = append(want, 10, 9, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
	want = append(want, 10, 9, 3, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
	want = append(want, 0, 0, 0, 0)
	want = binary.NativeEndian.AppendUint32(want, 0x01020304)
	want = binary.NativeEndian.AppendUint32(want, 0x0a0b0c0d)
	if len(got) != destroyRequestLen || (destroyRequest{}).Len() != destroyRequestLen || !bytes.Equal(got, want) {
		t.Fatalf("request\n% x\nwant\n% x", got, want)
	}
}

// readErr reads from c until it fails or 5 s pass and returns the error
// and how long it took. It may run on any goroutine.
func readErr(c net.Conn) (time.Duration, error) {
	start := time.Now()
	if err := c.SetReadDeadline(start.Add(5 * time.Second)); err != nil {
		return 0, err
	}
	_, err := c.Read(make([]byte, 16))
	return time.Since(start), err
}

// DestroySocket closes another party's socket for real, TCP and connected
// UDP: a read blocked on it fails with ECONNABORTED at once; the socket's
// peer is untouched (UDP) or reset (TCP); a socket that is not there is
// named as such.
func TestPrivilegedDestroySocketAbortsTheApplicationsSocket(t *testing.T) {
	n := newTestNS(t)
	d := openIn(t, n, Options{})
	client, server := dialPair(t, n, 6011)
	defer client.Close()
	defer server.Close()
	var u1, u2 *net.UDPConn
	if err := netns.Do(n.name, func() (err error) {
		if u1, err = net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(10, 9, 0, 1), Port: 6012}); err != nil {
			return err
		}
		u2, err = net.DialUDP("udp4", &net.UDPAddr{IP: net.IPv4(10, 9, 0, 254), Port: 6013}, &net.UDPAddr{IP: net.IPv4(10, 9, 0, 1), Port: 6012})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer u1.Close()
	defer u2.Close()

	type result struct {
		err  error
		took time.Duration
	}
	reads := map[string]chan result{"tcp": make(chan result, 1), "udp": make(chan result, 1)}
	for name, c := range map[string]net.Conn{"tcp": server, "udp": u2} {
		go func() { took, err := readErr(c); reads[name] <- result{err, took} }()
	}
	for _, tu := range []Tuple{tupleOf(TCP, server), tupleOf(UDP, u2)} {
		if err := d.DestroySocket(tu); err != nil {
			t.Fatalf("destroy %s: %v", tu, err)
		}
	}
	for name, ch := range reads {
		r := <-ch
		if !errors.Is(r.err, syscall.ECONNABORTED) || r.took > 2*time.Second {
			t.Errorf("%s: the destroyed socket's read ended with %v after %v, want ECONNABORTED at once", name, r.err, r.took)
		}
	}
	// The TCP peer was reset; the UDP peer (never connected) still works.
	if _, err := readErr(client); !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
		t.Errorf("tcp peer: read %v, want the reset", err)
	}
	if _, err := u1.WriteToUDP([]byte("x"), u2.LocalAddr().(*net.UDPAddr)); err != nil {
		t.Errorf("udp peer after the destroy: %v", err)
	}
	// Gone: named as such, and what the kernel's lookup falls back to
	// then (a listener on the port, an unconnected UDP socket) is not hit.
	var ln net.Listener
	var u3 *net.UDPConn
	u2t := tupleOf(UDP, u2)
	if err := u2.Close(); err != nil {
		t.Fatal(err)
	}
	if err := netns.Do(n.name, func() (err error) {
		if ln, err = net.Listen("tcp4", server.LocalAddr().String()); err != nil {
			return err
		}
		u3, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(u2t.Local))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	defer u3.Close()
	for _, tu := range []Tuple{tupleOf(TCP, server), u2t} {
		if err := d.DestroySocket(tu); !errors.Is(err, unix.ENOENT) {
			t.Errorf("destroy %s, whose socket is gone: %v, want ENOENT", tu, err)
		}
	}
	if err := netns.Do(n.name, func() error {
		c, err := net.DialTimeout("tcp4", ln.Addr().String(), 2*time.Second)
		if err != nil {
			return fmt.Errorf("the listener on the gone connection's port: %w", err)
		}
		return c.Close()
	}); err != nil {
		t.Error(err)
	}
	if _, err := u1.WriteToUDP([]byte("y"), net.UDPAddrFromAddrPort(u2t.Local)); err != nil {
		t.Fatal(err)
	}
	if _, err := readErr(u3); err != nil {
		t.Errorf("the unconnected UDP socket on the gone connection's port: %v", err)
	}
	if err := d.DestroySocket(Tuple{Proto: 1, Local: ap("10.9.0.1:1"), Remote: ap("10.9.0.2:2")}); err == nil {
		t.Error("destroy with protocol 1 accepted")
	}
	if err := d.CanDestroySockets(); err != nil {
		t.Errorf("CanDestroySockets on this kernel (CONFIG_INET_DIAG_DESTROY=y): %v", err)
	}
}
