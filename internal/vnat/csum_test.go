package vnat

import (
	"bytes"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/netns"
	"github.com/onehop/onehop/internal/netns/netnstest"
	"github.com/onehop/onehop/internal/testenv"
)

// TestPrivilegedTranslatedChecksumsAreAcceptedByTheKernel sends every
// frame the programs translate through a real veth, whose receiving end
// has checksum offload off (so the stack verifies every checksum itself),
// into a namespace that owns the destination address: UDP datagrams must
// reach their sockets, TCP segments must be answered with a reset (Linux
// resets only a segment whose checksum is right), and InCsumErrors must
// not move. The same frames with one checksum byte spoiled are the control:
// they must be counted as checksum errors, proving the kernel really checked.
func TestPrivilegedTranslatedChecksumsAreAcceptedByTheKernel(t *testing.T) {
	testenv.RequireTool(t, "ethtool", "ip")
	n := newTestNS(t)
	d := openIn(t, n, Options{})
	egress, ingress, _ := d.Programs()

	rx := newInjector(t)
	// The namespace owns only the destination of the frame under test (a
	// source it owned would be a martian).
	own := func(a string) {
		rx.sh(t, "ip", "addr", "flush", "dev", "dst")
		rx.sh(t, "ip", "addr", "add", a+"/32", "dev", "dst")
		rx.sh(t, "ip", "route", "replace", "default", "dev", "dst")
	}

	// UDP sockets on every destination port a translated frame carries.
	socks := map[uint16]*net.UDPConn{}
	for _, port := range []uint16{vA.Port(), vB.Port(), pA.Port()} {
		err := netns.Do(rx.name, func() error {
			c, err := net.ListenUDP("udp4", &net.UDPAddr{Port: int(port)})
			socks[port] = c
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		defer socks[port].Close()
	}
	recv := func(port uint16, want string) error {
		c := socks[port]
		if err := c.SetReadDeadline(time.Now().Add(2 * time.Second)); err != nil {
			return err
		}
		buf := make([]byte, 2048)
		k, _, err := c.ReadFromUDP(buf)
		if err != nil {
			return fmt.Errorf("port %d: %w", port, err)
		}
		if string(buf[:k]) != want {
			return fmt.Errorf("port %d: got %q, want %q", port, buf[:k], want)
		}
		return nil
	}

	type translated struct {
		name  string
		proto Proto
		frame []byte
		dst   string
		dport uint16
		body  string
	}
	var frames []translated
	for _, proto := range []Proto{TCP, UDP} {
		for _, m := range []struct {
			name string
			p    Physical
		}{
			{"local moved", Physical{Local: pA, Remote: vB}},
			{"remote moved", Physical{Local: vA, Remote: pB}},
			{"both moved", Physical{Local: pA, Remote: pB}},
		} {
			v := Virtual{Proto: proto, Local: vA, Remote: vB}
			p := m.p
			p.Proto = proto
			if err := d.Translate(v, p); err != nil {
				t.Fatal(err)
			}
			body := fmt.Sprintf("%s %s egress", proto, m.name)
			_, out := run(t, egress, pkt{proto: proto, src: vA, dst: vB, payload: body, seq: 1000}.build(t))
			frames = append(frames, translated{body, proto, out, p.Remote.Addr().String(), p.Remote.Port(), body})
			body = fmt.Sprintf("%s %s ingress", proto, m.name)
			_, out = run(t, ingress, pkt{proto: proto, src: p.Remote, dst: p.Local, payload: body, seq: 1000}.build(t))
			frames = append(frames, translated{body, proto, out, vA.Addr().String(), vA.Port(), body})
			if err := d.Forget(v); err != nil {
				t.Fatal(err)
			}
		}
	}

	for _, f := range frames {
		t.Run(f.name, func(t *testing.T) {
			own(f.dst)
			csumErrs := netnstest.SNMP(t, rx.name, protoName(f.proto), "InCsumErrors")
			rsts := netnstest.SNMP(t, rx.name, "Tcp", "OutRsts")
			rx.inject(t, f.frame)
			if f.proto == UDP {
				if err := recv(f.dport, f.body); err != nil {
					t.Errorf("translated datagram not delivered: %v", err)
				}
			} else {
				testenv.Eventually(t, "a reset for the translated segment", 3*time.Second, func() bool { return netnstest.SNMP(t, rx.name, "Tcp", "OutRsts") > rsts })
			}
			if got := netnstest.SNMP(t, rx.name, protoName(f.proto), "InCsumErrors"); got != csumErrs {
				t.Errorf("InCsumErrors moved %d -> %d", csumErrs, got)
			}

			// Control: spoil the L4 checksum; the kernel must count it.
			bad := bytes.Clone(f.frame)
			off := 14 + 20 + 16 // TCP checksum
			if f.proto == UDP {
				off = 14 + 20 + 6
			}
			bad[off] ^= 0x5a
			rx.inject(t, bad)
			testenv.Eventually(t, "the spoiled copy counted as a checksum error", 3*time.Second, func() bool {
				return netnstest.SNMP(t, rx.name, protoName(f.proto), "InCsumErrors") > csumErrs
			})
		})
	}
}

func protoName(p Proto) string {
	if p == TCP {
		return "Tcp"
	}
	return "Udp"
}
