package xtr

import (
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/internal/netns"
	"github.com/onehop/onehop/internal/netns/netnstest"
	"github.com/onehop/onehop/internal/testenv"
)

// The packet socket's classic BPF filter passes the encapsulated SYNs, and
// only them, off a real interface: a SYN, an ACK, a SYN to port 4342 and an
// outer fragment are sent into the interface; one frame arrives, the SYN,
// and SynOf reads it.
func TestPrivilegedSynSocketReceivesOnlyEncapsulatedSYNs(t *testing.T) {
	testenv.RequireRoot(t, "creates a network namespace and a packet socket")
	testenv.RequireTool(t, "ip")
	ns := netnstest.New(t, "cl-xtr-syn")
	netnstest.Veth(t, "a0", ns, "b0", ns)
	frames := [][]byte{
		lispSYN(t, false, true, 4341, false), // an ACK
		lispSYN(t, true, false, 4342, false), // control port
		lispSYN(t, true, false, 4341, true),  // outer fragment
		lispSYN(t, true, false, 4341, false), // the SYN
	}
	var got []Syn
	err := netns.Do(ns, func() error {
		a, err := netlink.LinkByName("a0")
		if err != nil {
			return err
		}
		b, err := netlink.LinkByName("b0")
		if err != nil {
			return err
		}
		fd, err := synSocket(b.Attrs().Index)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		tx, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(htons(unix.ETH_P_ALL)))
		if err != nil {
			return err
		}
		defer unix.Close(tx)
		to := &unix.SockaddrLinklayer{Ifindex: a.Attrs().Index, Halen: 6}
		for _, f := range frames {
			if err := unix.Sendto(tx, f, 0, to); err != nil {
				return err
			}
		}
		buf := make([]byte, 512)
		for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); {
			n, _, err := unix.Recvfrom(fd, buf, 0)
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				continue
			}
			if err != nil {
				return err
			}
			s, ok := SynOf(buf[:n])
			if !ok {
				t.Errorf("the filter passed a frame SynOf refuses: %x", buf[:n])
				continue
			}
			got = append(got, s)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].EID != netip.MustParseAddr("10.77.0.2") {
		t.Fatalf("received %+v; want the one SYN from 10.77.0.2", got)
	}
}
