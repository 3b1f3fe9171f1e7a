package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/onehop/onehop/internal/bpftest"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/lab"
	"github.com/onehop/onehop/internal/netns"
	"github.com/onehop/onehop/internal/testenv"
)

// tapGuestLab has a lab VM on h2 only: the tap guest on h1 is created
// through the API by the test.
const tapGuestLab = `name: %s
hosts: [{name: h1}, {name: h2}]
farms:
  - name: blue
    subnets: [{name: web}]
vms:
  - {name: web2, host: h2, subnet: blue/web}
`

// tapNIC is a tap device whose fd the test holds: the guest's NIC, as
// QEMU's -netdev tap holds it. What the test writes to the fd the device
// receives (the vif program's tcx ingress; a macvtap's egress); what the
// host sends out of the device (into a macvtap) the test reads.
type tapNIC struct {
	t      *testing.T
	f      *os.File
	frames chan []byte
	// hdr is the virtio_net_hdr before each frame on the fd (0: none; a
	// macvtap's fd has one of 10 bytes): written as zeros, read past.
	hdr int
}

// openTap creates tap device name (IFF_TAP|IFF_NO_PI, no vnet_hdr) in
// network namespace ns, brings it up and reads its frames until the test
// ends. Closing the fd at cleanup removes the device.
func openTap(t *testing.T, ns, name string) *tapNIC {
	t.Helper()
	fd, err := netns.OpenTap(netns.Path(ns), name, true)
	if err != nil {
		t.Fatal(err)
	}
	nic := readNIC(t, fd, name, 0)
	h, err := netns.Handle(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByName(name)
	if err == nil {
		err = h.LinkSetUp(l)
	}
	if err != nil {
		t.Fatalf("bring %s up: %v", name, err)
	}
	return nic
}

// readNIC reads the frames of the guest NIC whose fd is fd (non-blocking)
// until the test ends, each after a header of hdr bytes.
func readNIC(t *testing.T, fd int, name string, hdr int) *tapNIC {
	t.Helper()
	// Non-blocking: the runtime poller reads it, and Close wakes the reader.
	nic := &tapNIC{t: t, f: os.NewFile(uintptr(fd), name), frames: make(chan []byte, 256), hdr: hdr}
	done := make(chan struct{})
	t.Cleanup(func() { nic.f.Close(); <-done })
	go func() {
		defer close(done)
		for {
			b := make([]byte, 65536)
			n, err := nic.f.Read(b)
			if err != nil {
				return
			}
			if n < hdr {
				continue
			}
			select {
			case nic.frames <- b[hdr:n]:
			default: // nobody is waiting for this much: the test reads what it awaits
			}
		}
	}()
	return nic
}

// send writes one whole Ethernet frame, as the guest's NIC would send it.
func (n *tapNIC) send(frame []byte) {
	n.t.Helper()
	if _, err := n.f.Write(append(make([]byte, n.hdr), frame...)); err != nil {
		n.t.Fatalf("write to the tap: %v", err)
	}
}

// await reads frames out of the tap until one matches (returning its
// decoding) or timeout passes (nil). Frames the host's own stack sends
// (IPv6 router solicitations and the like) are read past.
func (n *tapNIC) await(timeout time.Duration, match func(gopacket.Packet) bool) gopacket.Packet {
	deadline := time.After(timeout)
	for {
		select {
		case b := <-n.frames:
			p := gopacket.NewPacket(b, layers.LayerTypeEthernet, gopacket.Default)
			if match(p) {
				return p
			}
		case <-deadline:
			return nil
		}
	}
}

// drain forgets the frames read so far.
func (n *tapNIC) drain() {
	for {
		select {
		case <-n.frames:
		default:
			return
		}
	}
}

// dhcpFrame is a client's broadcast DHCP message of type typ from mac.
func dhcpFrame(t *testing.T, mac net.HardwareAddr, xid uint32, typ layers.DHCPMsgType, opts ...layers.DHCPOption) []byte {
	t.Helper()
	d := &layers.DHCPv4{Operation: layers.DHCPOpRequest, HardwareType: layers.LinkTypeEthernet, HardwareLen: 6,
		Xid: xid, Flags: 0x8000, ClientHWAddr: mac,
		Options: append([]layers.DHCPOption{layers.NewDHCPOption(layers.DHCPOptMessageType, []byte{byte(typ)})}, opts...)}
	eth := &layers.Ethernet{SrcMAC: mac, DstMAC: layers.EthernetBroadcast, EthernetType: layers.EthernetTypeIPv4}
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: net.IPv4zero, DstIP: net.IPv4bcast}
	udp := &layers.UDP{SrcPort: 68, DstPort: 67}
	udp.SetNetworkLayerForChecksum(ip)
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, eth, ip, udp, d); err != nil {
		t.Fatalf("build DHCP %s: %v", typ, err)
	}
	return buf.Bytes()
}

// dhcpReply matches the server's DHCP message of type typ for xid.
func dhcpReply(xid uint32, typ layers.DHCPMsgType) func(gopacket.Packet) bool {
	return func(p gopacket.Packet) bool {
		d, ok := p.Layer(layers.LayerTypeDHCPv4).(*layers.DHCPv4)
		if !ok || d.Operation != layers.DHCPOpReply || d.Xid != xid {
			return false
		}
		for _, o := range d.Options {
			if o.Type == layers.DHCPOptMessageType && len(o.Data) == 1 {
				return layers.DHCPMsgType(o.Data[0]) == typ
			}
		}
		return false
	}
}

// echoReply matches the echo reply from src to dst with id.
func echoReply(src, dst netip.Addr, id uint16) func(gopacket.Packet) bool {
	return func(p gopacket.Packet) bool {
		ip, ok := p.Layer(layers.LayerTypeIPv4).(*layers.IPv4)
		icmp, ok2 := p.Layer(layers.LayerTypeICMPv4).(*layers.ICMPv4)
		return ok && ok2 && ip.SrcIP.Equal(src.AsSlice()) && ip.DstIP.Equal(dst.AsSlice()) &&
			icmp.TypeCode.Type() == layers.ICMPv4TypeEchoReply && icmp.Id == id
	}
}

// vmRecord is the controller's record of farm/subnet/name.
func (l *testLab) vmRecord(full string) intent.VM {
	l.t.Helper()
	out, err := l.cli("get", "vms", "-o", "json")
	if err != nil {
		l.t.Fatalf("get vms: %v\n%s", err, out)
	}
	var vms []intent.VM
	if err := json.Unmarshal([]byte(out), &vms); err != nil {
		l.t.Fatalf("get vms -o json: %v\n%s", err, out)
	}
	for _, v := range vms {
		if v.FullName() == full {
			return v
		}
	}
	l.t.Fatalf("no VM %s in:\n%s", full, out)
	return intent.VM{}
}

func TestPrivilegedTapGuestGetsALeaseResolvesAndPingsALabVMAndCannotSpoof(t *testing.T) {
	l := upLab(t, tapGuestLab)
	const tapName = "tapg1"
	nic := openTap(t, lab.NamespaceOf(l.name, "h1"), tapName)
	if out, err := l.cli("vm", "create", "blue/web/guest1", "--host", "h1", "--interface", tapName); err != nil {
		t.Fatalf("vm create --interface %s: %v\n%s", tapName, err, out)
	}
	vm := l.vmRecord("blue/web/guest1")
	if vm.Interface != tapName {
		t.Fatalf("guest1's interface is %q, want %s", vm.Interface, tapName)
	}
	web2 := netip.MustParseAddr(l.ip("web2"))

	// (1) h1's agent attached to the tap and knows it for one.
	l.awaitVifKind("h1", "tap", tapName)
	guestTalksAndCannotSpoof(t, l, nic, vm, web2)
}

// awaitVifKind waits until host's agent has attached to interface name as
// a vif of kind ("tap vifs: NAME" in `onehop stats`).
func (l *testLab) awaitVifKind(host, kind, name string) {
	l.t.Helper()
	want := kind + " vifs: " + name + "\n"
	testenv.Eventually(l.t, host+"'s agent to attach to "+name+" as a "+kind, 10*time.Second, func() error {
		out, err := l.cli("stats", "--node", host)
		if err != nil {
			return fmt.Errorf("onehop stats: %v: %s", err, out)
		}
		if !strings.Contains(out, want) {
			return fmt.Errorf("no %q in:\n%s", want, out)
		}
		return nil
	})
}

// guestTalksAndCannotSpoof drives the guest on nic from raw frames: a DHCP
// lease with its intent address, an ARP answer for web2 (a lab VM on
// another host) and web2's echo reply, delivered to the NIC; then the same
// echo from a source the guest does not own is dropped and counted on h1,
// and the right source right after is answered (the positive control).
func guestTalksAndCannotSpoof(t *testing.T, l *testLab, nic *tapNIC, vm intent.VM, web2 netip.Addr) {
	t.Helper()
	guestIP, guestMAC := netip.MustParseAddr(vm.IP), bpftest.MustMAC(vm.MAC)
	where := "the guest's NIC"
	// (2) DHCP from raw frames: DISCOVER -> OFFER, REQUEST -> ACK, both
	// with the VM's intent address, from its gateway.
	var gateway netip.Addr
	testenv.Eventually(t, "an OFFER on "+where+" for the DISCOVER", 10*time.Second, func() error {
		nic.send(dhcpFrame(t, guestMAC, 0x7a9001, layers.DHCPMsgTypeDiscover))
		p := nic.await(time.Second, dhcpReply(0x7a9001, layers.DHCPMsgTypeOffer))
		if p == nil {
			return errors.New("no OFFER within a second")
		}
		d := p.Layer(layers.LayerTypeDHCPv4).(*layers.DHCPv4)
		if !d.YourClientIP.Equal(guestIP.AsSlice()) {
			return fmt.Errorf("offered %s, want guest1's %s", d.YourClientIP, guestIP)
		}
		if eth := p.Layer(layers.LayerTypeEthernet).(*layers.Ethernet); eth.DstMAC.String() != guestMAC.String() {
			return fmt.Errorf("OFFER to %s, want guest1's %s", eth.DstMAC, guestMAC)
		}
		gateway, _ = netip.AddrFromSlice(d.NextServerIP.To4())
		return nil
	})
	nic.send(dhcpFrame(t, guestMAC, 0x7a9002, layers.DHCPMsgTypeRequest,
		layers.NewDHCPOption(layers.DHCPOptRequestIP, guestIP.AsSlice()),
		layers.NewDHCPOption(layers.DHCPOptServerID, gateway.AsSlice())))
	ack := nic.await(5*time.Second, dhcpReply(0x7a9002, layers.DHCPMsgTypeAck))
	if ack == nil {
		t.Fatal("no ACK on " + where + " for the REQUEST")
	}
	if d := ack.Layer(layers.LayerTypeDHCPv4).(*layers.DHCPv4); !d.YourClientIP.Equal(guestIP.AsSlice()) {
		t.Fatalf("ACK gives %s, want guest1's %s", d.YourClientIP, guestIP)
	}

	// (3) ARP: guest1 asks for web2 (same subnet, on h2); the answer comes
	// out of the tap.
	var web2MAC net.HardwareAddr
	testenv.Eventually(t, "an ARP answer on "+where+" for web2", 10*time.Second, func() error {
		nic.send(bpftest.Frame{Src: guestMAC, Dst: layers.EthernetBroadcast, ARPOp: layers.ARPRequest,
			Saddr: guestIP, Daddr: web2}.Bytes(t))
		p := nic.await(time.Second, func(p gopacket.Packet) bool {
			a, ok := p.Layer(layers.LayerTypeARP).(*layers.ARP)
			return ok && a.Operation == layers.ARPReply && net.IP(a.SourceProtAddress).Equal(web2.AsSlice()) &&
				net.IP(a.DstProtAddress).Equal(guestIP.AsSlice())
		})
		if p == nil {
			return errors.New("no ARP reply for web2 within a second")
		}
		web2MAC = p.Layer(layers.LayerTypeARP).(*layers.ARP).SourceHwAddress
		return nil
	})

	// (4) An echo request to web2 gets its reply back out of the tap.
	echo := func(src netip.Addr, id uint16) []byte {
		return bpftest.Frame{Src: guestMAC, Dst: web2MAC, Saddr: src, Daddr: web2,
			Proto: layers.IPProtocolICMPv4, ICMPType: layers.ICMPv4TypeEchoRequest, ICMPID: id}.Bytes(t)
	}
	testenv.Eventually(t, "web2's echo reply on "+where, 10*time.Second, func() error {
		nic.send(echo(guestIP, 0x4201))
		if nic.await(time.Second, echoReply(web2, guestIP, 0x4201)) == nil {
			return errors.New("no echo reply from web2 within a second")
		}
		return nil
	})

	// (5) The same flow from a source guest1 does not own is dropped and
	// counted; the right source, right after, is answered.
	spoofed := netip.MustParseAddr("10.1.1.250")
	if spoofed == guestIP || spoofed == web2 {
		t.Fatalf("the spoofed source %s is a real VM's", spoofed)
	}
	nic.drain()
	d := l.dropDelta("h1", func() {
		nic.send(echo(spoofed, 0x4202))
		if p := nic.await(time.Second, func(p gopacket.Packet) bool {
			icmp, ok := p.Layer(layers.LayerTypeICMPv4).(*layers.ICMPv4)
			return ok && icmp.Id == 0x4202
		}); p != nil {
			t.Errorf("a reply to the spoofed echo came back: %v", p)
		}
	}, "spoofed_ip")
	if d["spoofed_ip"] != 1 {
		t.Errorf("h1's spoofed_ip drops rose by %v, want 1", d["spoofed_ip"])
	}
	nic.send(echo(guestIP, 0x4203))
	if nic.await(2*time.Second, echoReply(web2, guestIP, 0x4203)) == nil {
		t.Error("the positive control (guest1's own source) after the spoofed echo got no reply")
	}
}
