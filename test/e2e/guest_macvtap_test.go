package e2e

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/internal/bpftest"
	"github.com/onehop/onehop/internal/lab"
	"github.com/onehop/onehop/internal/netns"
)

// macvtapVnetHdr is the virtio_net_hdr before every frame on a macvtap's
// fd: IFF_VNET_HDR is on when a macvtap is opened, as QEMU wants it.
const macvtapVnetHdr = 10

// A macvtap guest, as libvirt's <interface type='direct'> makes one: a
// macvtap in bridge mode on a lower device (here a veth in h1's namespace:
// this machine has no dummy links), the test process holding its fd as
// QEMU would. The agent attaches to it as a macvtap, and the guest gets its
// lease, resolves and pings a lab VM on h2 and cannot spoof, as a tap
// guest does. Then what the lower device hands the guest on its own (the
// macvlan rx path, past the datapath) never reaches its fd and is counted:
// a unicast frame for its MAC and a broadcast from the lower device's wire,
// and a frame from another macvtap of the same lower device (bridge mode).
// The positive control is a second macvtap on the same lower device that
// is no guest's: it receives the same frames, so the path is live.
func TestPrivilegedMacvtapGuestTalksLikeATapAndHearsNothingItsLowerDeviceHandsIt(t *testing.T) {
	l := upLab(t, tapGuestLab)
	ns := lab.NamespaceOf(l.name, "h1")
	h, err := netns.Handle(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	const mvName, ctlName = "mvtg1", "mvtctl"
	// The lower device and its wire end; deleting the lower device deletes
	// the macvtaps on it.
	lowerAttrs := netlink.NewLinkAttrs()
	lowerAttrs.Name = "mvlow"
	lower := &netlink.Veth{LinkAttrs: lowerAttrs, PeerName: "mvwire"}
	if err := h.LinkAdd(lower); err != nil {
		t.Fatalf("add the lower veth: %v", err)
	}
	t.Cleanup(func() {
		if l, err := h.LinkByName("mvlow"); err == nil {
			h.LinkDel(l)
		}
	})
	for _, name := range []string{"mvlow", "mvwire"} {
		if err := setUp(h, name); err != nil {
			t.Fatal(err)
		}
	}
	lowerIdx := linkIndex(t, h, "mvlow")

	if out, err := l.cli("vm", "create", "blue/web/guest1", "--host", "h1", "--interface", mvName); err != nil {
		t.Fatalf("vm create --interface %s: %v\n%s", mvName, err, out)
	}
	vm := l.vmRecord("blue/web/guest1")
	guestMAC := bpftest.MustMAC(vm.MAC)
	web2 := netip.MustParseAddr(l.ip("web2"))
	ctlMAC := bpftest.MustMAC("02:00:00:6d:76:01")

	// As libvirt makes it: the guest's MAC on the macvtap, left down (the
	// agent brings it up once its programs are on).
	for _, m := range []struct {
		name string
		mac  net.HardwareAddr
	}{{mvName, guestMAC}, {ctlName, ctlMAC}} {
		// NewLinkAttrs: a zero TxQLen would be sent as txqueuelen 0, and a
		// macvtap's queue to its fd is txqueuelen long: every frame for
		// the guest would be dropped (rx_errors).
		attrs := netlink.NewLinkAttrs()
		attrs.Name, attrs.ParentIndex, attrs.HardwareAddr = m.name, lowerIdx, m.mac
		mv := &netlink.Macvtap{Macvlan: netlink.Macvlan{LinkAttrs: attrs, Mode: netlink.MACVLAN_MODE_BRIDGE}}
		if err := h.LinkAdd(mv); err != nil {
			t.Fatalf("add macvtap %s: %v", m.name, err)
		}
	}
	if err := setUp(h, ctlName); err != nil { // no guest's: nothing attaches, nothing brings it up
		t.Fatal(err)
	}
	dir := t.TempDir()
	open := func(name string) *tapNIC {
		fd, err := netns.OpenMacvtap(ns, name, dir, true)
		if err != nil {
			t.Fatal(err)
		}
		return readNIC(t, fd, name, macvtapVnetHdr)
	}
	nic, ctl := open(mvName), open(ctlName)

	l.awaitVifKind("h1", "macvtap", mvName)
	guestTalksAndCannotSpoof(t, l, nic, vm, web2)

	// Frames from the lower device's wire, sent by a packet socket on its
	// far end.
	wire := packetSocket(t, ns)
	wireIdx := linkIndex(t, h, "mvwire")
	wireMAC := bpftest.MustMAC("02:00:00:6d:76:02")
	raw := func(dst, src net.HardwareAddr, tag string) []byte {
		b := append(append(append([]byte{}, dst...), src...), 0x88, 0xb5) // local experimental EtherType
		return append(b, []byte(tag+"-padding-to-sixty-bytes-of-frame-and-more")...)
	}
	tagged := func(tag string) func(gopacket.Packet) bool {
		return func(p gopacket.Packet) bool { return bytes.Contains(p.Data(), []byte(tag)) }
	}
	for _, c := range []struct {
		name, tag string
		send      func(tag string)
	}{
		{"a unicast frame for the guest's MAC from the lower device's wire", "bypass-unicast",
			func(tag string) { wire.send(t, wireIdx, raw(guestMAC, wireMAC, tag)) }},
		{"a broadcast from the lower device's wire", "bypass-broadcast",
			func(tag string) { wire.send(t, wireIdx, raw(layers.EthernetBroadcast, wireMAC, tag)) }},
		{"a frame for the guest from another macvtap of the lower device (bridge mode)", "bypass-bridge",
			func(tag string) { ctl.send(raw(guestMAC, ctlMAC, tag)) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			nic.drain()
			ctl.drain()
			d := l.dropDelta("h1", func() {
				c.send(c.tag)
				if p := nic.await(time.Second, tagged(c.tag)); p != nil {
					t.Errorf("the guest's fd got it: %v", p)
				}
			}, "macvtap_bypass")
			if d["macvtap_bypass"] != 1 {
				t.Errorf("h1's macvtap_bypass drops rose by %v, want 1", d["macvtap_bypass"])
			}
		})
	}
	// The positive control: the same path delivers to a macvtap no guard
	// is on, unicast and broadcast.
	for _, dst := range []net.HardwareAddr{ctlMAC, layers.EthernetBroadcast} {
		tag := "control-" + dst.String()
		wire.send(t, wireIdx, raw(dst, wireMAC, tag))
		if ctl.await(2*time.Second, tagged(tag)) == nil {
			t.Errorf("the control macvtap did not get the frame for %s from the lower device's wire: the bypass path is not live", dst)
		}
	}
}

// setUp brings link name up through h.
func setUp(h *netlink.Handle, name string) error {
	l, err := h.LinkByName(name)
	if err == nil {
		err = h.LinkSetUp(l)
	}
	if err != nil {
		return fmt.Errorf("bring %s up: %w", name, err)
	}
	return nil
}

func linkIndex(t *testing.T, h *netlink.Handle, name string) int {
	t.Helper()
	l, err := h.LinkByName(name)
	if err != nil {
		t.Fatalf("link %s: %v", name, err)
	}
	return l.Attrs().Index
}

// rawSocket is a packet socket in a namespace the test made.
type rawSocket struct{ fd int }

// packetSocket opens a send-only packet socket in namespace ns (a socket
// stays in the namespace it was made in); closed when the test ends.
func packetSocket(t *testing.T, ns string) *rawSocket {
	t.Helper()
	s := &rawSocket{fd: -1}
	err := netns.Do(ns, func() error {
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
		s.fd = fd
		return err
	})
	if err != nil {
		t.Fatalf("packet socket in %s: %v", ns, err)
	}
	t.Cleanup(func() { unix.Close(s.fd) })
	return s
}

// send puts frame out of the interface with ifindex.
func (s *rawSocket) send(t *testing.T, ifindex int, frame []byte) {
	t.Helper()
	to := &unix.SockaddrLinklayer{Ifindex: ifindex, Halen: 6}
	copy(to.Addr[:], frame[:6])
	if err := unix.Sendto(s.fd, frame, 0, to); err != nil {
		t.Fatalf("send on ifindex %d: %v", ifindex, err)
	}
}
