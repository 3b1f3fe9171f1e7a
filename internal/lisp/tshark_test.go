package lisp

import (
	"bytes"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/google/gopacket/pcapgo"

	"github.com/onehop/onehop/internal/testenv"
)

// An independent decoder, Wireshark's, reads what this package writes as
// the LISP it expects: each message type, the nonce, the records' EIDs,
// TTLs, actions and locators, the authentication data length, and the data
// header's nonce and instance id.
func TestTsharkDecodesEveryMessageThisPackageWrites(t *testing.T) {
	testenv.RequireTool(t, "tshark")
	key := []byte("site-one-shared-secret")
	reg := MapRegister{Nonce: nonce, ProxyReply: true, WantMapNotify: true, Records: []Record{goldenRec()}}
	rb, err := reg.Seal(1, key)
	if err != nil {
		t.Fatal(err)
	}
	nt := MapNotify{Nonce: nonce, Records: []Record{goldenRec()}}
	nb, err := nt.Seal(1, key)
	if err != nil {
		t.Fatal(err)
	}
	dh, err := DataHeader{NonceValid: true, LSBValid: true, InstanceIDValid: true, Nonce: 0xabcdef, InstanceID: 42, LSB: 3}.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	ecm, err := (&ECM{Source: netip.MustParseAddrPort("192.0.2.1:40000"), Dest: netip.MustParseAddrPort("10.1.2.3:4342"), Message: unhex(t, goldenRequest)}).Encode()
	if err != nil {
		t.Fatal(err)
	}
	inner := []byte{0x45, 0, 0, 20, 0, 0, 0, 0, 64, 6, 0, 0, 10, 1, 0, 1, 10, 1, 0, 2}
	packets := []struct {
		port    int
		payload []byte
	}{
		{ControlPort, unhex(t, goldenRequest)}, {ControlPort, unhex(t, goldenReply)}, {ControlPort, unhex(t, goldenNegative)},
		{ControlPort, rb}, {ControlPort, nb}, {DataPort, append(dh[:], inner...)}, {ControlPort, ecm},
	}
	path := filepath.Join(t.TempDir(), "lisp.pcap")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w := pcapgo.NewWriter(f)
	if err := w.WriteFileHeader(65535, layers.LinkTypeEthernet); err != nil {
		t.Fatal(err)
	}
	for _, p := range packets {
		eth := &layers.Ethernet{SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}, DstMAC: net.HardwareAddr{2, 0, 0, 0, 0, 2}, EthernetType: layers.EthernetTypeIPv4}
		ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: net.IP{192, 0, 2, 1}, DstIP: net.IP{192, 0, 2, 2}}
		udp := &layers.UDP{SrcPort: 40000, DstPort: layers.UDPPort(p.port)}
		if err := udp.SetNetworkLayerForChecksum(ip); err != nil {
			t.Fatal(err)
		}
		buf := gopacket.NewSerializeBuffer()
		if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, eth, ip, udp, gopacket.Payload(p.payload)); err != nil {
			t.Fatal(err)
		}
		if err := w.WritePacket(gopacket.CaptureInfo{CaptureLength: len(buf.Bytes()), Length: len(buf.Bytes())}, buf.Bytes()); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd := exec.Command("tshark", "-r", path, "-T", "fields", "-E", "separator=|",
		"-e", "lisp.type", "-e", "lisp.nonce", "-e", "lisp.mapping.eid.ipv4", "-e", "lisp.mapping.ttl", "-e", "lisp.mapping.act",
		"-e", "lisp.loc.locator", "-e", "lisp.authlen", "-e", "lisp-data.nonce", "-e", "lisp-data.iid", "-e", "_ws.expert")
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("tshark: %v: %s", err, stderr.String())
	}
	want := []string{
		"1|0x0102030405060708||||||||",
		"2|0x0102030405060708|10.1.0.0|1440|0|192.0.2.10,198.51.100.10||||",
		"2|0x0102030405060708|11.0.0.0|15|1|||||",
		"3|0x0102030405060708|10.1.0.0|1440|0|192.0.2.10,198.51.100.10|16|||",
		"4|0x0102030405060708|10.1.0.0|1440|0|192.0.2.10,198.51.100.10|16|||",
		"|||||||11259375|42|",
		"8,1|0x0102030405060708||||||||",
	}
	got := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(got) != len(want) {
		t.Fatalf("tshark printed %d lines, want %d:\n%s", len(got), len(want), out)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("packet %d: tshark read %q, want %q", i+1, got[i], want[i])
		}
	}
}
