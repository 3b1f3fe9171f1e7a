package vnat

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/onehop/onehop/internal/netns/netnstest"
	"github.com/onehop/onehop/internal/testenv"
)

// seg is a TCP segment to build for the keepalive rows.
type seg struct {
	src, dst       string // addr:port
	seq, ack       uint32
	fin, syn, psh  bool
	win            uint16
	ts             *[2]uint32 // TSval, TSecr (NOP NOP TS), nil for none
	sack           bool       // a SACK-permitted option instead (not answerable)
	payload        string
	srcMAC, dstMAC []byte
	ttl            uint8
	id             uint16
	dontFrag       bool
}

func (s seg) build(t testing.TB) []byte {
	t.Helper()
	src, dst := ap(s.src), ap(s.dst)
	if s.srcMAC == nil {
		s.srcMAC, s.dstMAC = macA, macB
	}
	if s.ttl == 0 {
		s.ttl = 64
	}
	eth := &layers.Ethernet{SrcMAC: s.srcMAC, DstMAC: s.dstMAC, EthernetType: layers.EthernetTypeIPv4}
	ip := &layers.IPv4{Version: 4, IHL: 5, TTL: s.ttl, Id: s.id, Protocol: layers.IPProtocolTCP,
		SrcIP: src.Addr().AsSlice(), DstIP: dst.Addr().AsSlice()}
	if s.dontFrag {
		ip.Flags = layers.IPv4DontFragment
	}
	tcp := &layers.TCP{SrcPort: layers.TCPPort(src.Port()), DstPort: layers.TCPPort(dst.Port()),
		Seq: s.seq, Ack: s.ack, ACK: !s.syn, FIN: s.fin, SYN: s.syn, PSH: s.psh, Window: s.win}
	if s.ts != nil {
		var d [8]byte
		binary.BigEndian.PutUint32(d[0:], s.ts[0])
		binary.BigEndian.PutUint32(d[4:], s.ts[1])
		tcp.Options = []layers.TCPOption{{OptionType: layers.TCPOptionKindNop}, {OptionType: layers.TCPOptionKindNop},
			{OptionType: layers.TCPOptionKindTimestamps, OptionLength: 10, OptionData: d[:]}}
	}
	if s.sack {
		tcp.Options = []layers.TCPOption{{OptionType: layers.TCPOptionKindNop}, {OptionType: layers.TCPOptionKindNop},
			{OptionType: layers.TCPOptionKindSACKPermitted, OptionLength: 2}}
	}
	if err := tcp.SetNetworkLayerForChecksum(ip); err != nil {
		t.Fatal(err)
	}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true},
		eth, ip, tcp, gopacket.Payload(s.payload)); err != nil {
		t.Fatal(err)
	}
	// gopacket pads a frame to Ethernet's 60 bytes; a frame built in the
	// kernel (the helper's answer) is not padded.
	b := buf.Bytes()
	return b[:14+int(binary.BigEndian.Uint16(b[16:18]))]
}

// TestPrivilegedKeepaliveHelperAnswersProbesOfMarkedConnections runs the
// egress program on a marked connection's keepalive probes and on every
// packet that must not be taken for one. A probe (seq = snd_nxt-1, 0 or 1
// byte, ACK only) becomes the peer's ACK, byte for byte, redirected to
// ingress; everything else leaves untouched. The answers are then sent to
// a kernel with checksum offload off: it must answer them with a reset
// (sent only for a valid checksum) and count no checksum error, while a
// spoiled copy is counted (the control).
func TestPrivilegedKeepaliveHelperAnswersProbesOfMarkedConnections(t *testing.T) {
	n := newTestNS(t)
	d := openIn(t, n, Options{})
	egress, ingress, _ := d.Programs()
	v := Virtual{Proto: TCP, Local: vA, Remote: vB}
	local, remote := vA.String(), vB.String()

	counters := func() map[string]uint64 {
		t.Helper()
		c, err := d.Counters()
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	untouched := func(t *testing.T, what string, prog string, f []byte) {
		t.Helper()
		p := egress
		if prog == "ingress" {
			p = ingress
		}
		ret, got := run(t, p, f)
		if ret != tcxNext || !bytes.Equal(got, f) {
			t.Errorf("%s: verdict %#x, frame changed:\n got %x\nwant %x", what, ret, got, f)
		}
	}
	probe := seg{src: local, dst: remote, seq: 1009, ack: 7000, win: 502, ts: &[2]uint32{111, 222}, dontFrag: true, id: 0x4242}
	// The answer: the peer's ACK of everything sent, at the peer's
	// next sequence (the probe's ack), the peer's window, the
	// timestamps swapped.
	answer := seg{src: remote, dst: local, seq: 7000, ack: 1010, win: 501, ts: &[2]uint32{222, 111},
		srcMAC: macB, dstMAC: macA, dontFrag: true}

	// Nothing is marked: even a probe passes.
	untouched(t, "probe before marking", "egress", probe.build(t))

	if err := d.StartKeepalive(v); err != nil {
		t.Fatal(err)
	}
	// Before the program has seen the connection's sequence or the
	// peer's window (no socket under BPF_PROG_RUN), nothing is a probe.
	untouched(t, "probe with snd_nxt unknown", "egress", probe.build(t))
	// Data leaves (snd_nxt 1010) and the peer's window comes in (501).
	untouched(t, "data segment", "egress", seg{src: local, dst: remote, seq: 1000, ack: 7000, psh: true, win: 502, payload: "0123456789"}.build(t))
	before := counters()
	untouched(t, "probe with the peer's window unknown", "egress", probe.build(t))
	if c := counters(); c["keepalives_unanswered"]-before["keepalives_unanswered"] != 1 {
		t.Errorf("a probe without a window to answer with was not counted unanswered: %v -> %v", before, c)
	}
	untouched(t, "peer's ACK", "ingress", seg{src: remote, dst: local, seq: 7000, ack: 1010, win: 501}.build(t))

	answers := []struct {
		name  string
		probe seg
		want  seg
	}{
		{"probe with timestamps", probe, answer},
		{"probe of one byte", func() seg { p := probe; p.payload = "x"; return p }(), answer},
		{"probe without options", func() seg { p := probe; p.ts = nil; return p }(), func() seg { a := answer; a.ts = nil; return a }()},
	}
	var sent [][]byte
	for _, row := range answers {
		t.Run(row.name, func(t *testing.T) {
			before := counters()
			ret, got := run(t, egress, row.probe.build(t))
			want := row.want.build(t)
			if ret != 7 /* TC_ACT_REDIRECT */ || !bytes.Equal(got, want) {
				t.Fatalf("verdict %d (want 7, redirect)\n got %x\nwant %x", ret, got, want)
			}
			sent = append(sent, got)
			if c := counters(); c["keepalives_answered"]-before["keepalives_answered"] != 1 {
				t.Errorf("keepalives_answered moved %d -> %d, want +1", before["keepalives_answered"], c["keepalives_answered"])
			}
		})
	}
	if k, ok, err := d.KeepaliveAnswered(v); err != nil || !ok || k != 3 {
		t.Errorf("answered for the connection: %d, %v, %v; want 3", k, ok, err)
	}

	before = counters()
	for _, row := range []struct {
		name string
		f    seg
	}{
		{"pure ACK (seq = snd_nxt)", seg{src: local, dst: remote, seq: 1010, ack: 7000, win: 502, ts: &[2]uint32{111, 222}}},
		{"two bytes at snd_nxt-2", seg{src: local, dst: remote, seq: 1008, ack: 7000, win: 502, payload: "ab"}},
		{"FIN at snd_nxt-1", seg{src: local, dst: remote, seq: 1009, ack: 7000, win: 502, fin: true}},
		{"old data retransmitted", seg{src: local, dst: remote, seq: 1000, ack: 7000, psh: true, win: 502, payload: "0123456789"}},
		{"probe-shaped, other connection", seg{src: otherApp.String(), dst: remote, seq: 1009, ack: 7000, win: 502}},
		{"probe-shaped, wrong direction", seg{src: remote, dst: local, seq: 6999, ack: 1010, win: 501}},
	} {
		untouched(t, row.name, "egress", row.f.build(t))
	}
	// A probe with options the helper does not write (SACK-permitted
	// here) is left to go, and counted.
	untouched(t, "probe with other options", "egress", seg{src: local, dst: remote, seq: 1010, ack: 7000, win: 502, sack: true}.build(t))
	if c := counters(); c["keepalives_answered"] != before["keepalives_answered"] {
		t.Errorf("a non-probe was answered: %v -> %v", before, c)
	}
	// The next data moves snd_nxt on: the old probe's sequence is no
	// probe any more, the new one is.
	untouched(t, "more data", "egress", seg{src: local, dst: remote, seq: 1010, ack: 7000, psh: true, win: 502, payload: "abc"}.build(t))
	untouched(t, "stale probe sequence", "egress", probe.build(t))
	p2, a2 := probe, answer
	p2.seq, a2.ack = 1012, 1013
	if ret, got := run(t, egress, p2.build(t)); ret != 7 || !bytes.Equal(got, a2.build(t)) {
		t.Errorf("probe at the new snd_nxt-1: verdict %d\n got %x\nwant %x", ret, got, a2.build(t))
	}

	// Migrated too (both ends moved): the probe is still answered on
	// the virtual tuple the socket uses, and the answer is not
	// translated; data still is.
	if err := d.Translate(v, Physical{Proto: TCP, Local: pA, Remote: pB}); err != nil {
		t.Fatal(err)
	}
	if ret, got := run(t, egress, p2.build(t)); ret != 7 || !bytes.Equal(got, a2.build(t)) {
		t.Errorf("probe of a migrated connection: verdict %d\n got %x\nwant %x", ret, got, a2.build(t))
	}
	if ret, got := run(t, ingress, a2.build(t)); ret != tcxNext || !bytes.Equal(got, a2.build(t)) {
		t.Errorf("the answer at ingress of a migrated connection changed: verdict %#x\n got %x", ret, got)
	}
	data := seg{src: local, dst: remote, seq: 1013, ack: 7000, psh: true, win: 502, payload: "xyz"}
	wantData := data
	wantData.src, wantData.dst = pA.String(), pB.String()
	if ret, got := run(t, egress, data.build(t)); ret != tcxNext || !bytes.Equal(got, wantData.build(t)) {
		t.Errorf("data of a marked, migrated connection: verdict %#x\n got %x\nwant %x", ret, got, wantData.build(t))
	}
	if err := d.Forget(v); err != nil {
		t.Fatal(err)
	}

	k, err := d.StopKeepalive(v)
	if err != nil || k != 5 {
		t.Errorf("StopKeepalive: %d answered, %v; want 5", k, err)
	}
	untouched(t, "probe after unmarking", "egress", p2.build(t))

	t.Run("answers pass the kernel's checksum check", func(t *testing.T) {
		kernelAcceptsTCP(t, sent, vA.Addr().String())
	})
}

// kernelAcceptsTCP injects each frame into a namespace that owns dst (and
// has no socket for it), checksum offload off: a valid segment is answered
// with a reset, and no checksum error is counted; a spoiled copy is.
func kernelAcceptsTCP(t *testing.T, frames [][]byte, dst string) {
	rx := newInjector(t)
	rx.sh(t, "ip", "addr", "add", dst+"/32", "dev", "dst")
	rx.sh(t, "ip", "route", "replace", "default", "dev", "dst")
	for i, f := range frames {
		csumErrs := netnstest.SNMP(t, rx.name, "Tcp", "InCsumErrors")
		rsts := netnstest.SNMP(t, rx.name, "Tcp", "OutRsts")
		rx.inject(t, f)
		testenv.Eventually(t, "a reset for the answer", 3*time.Second, func() bool { return netnstest.SNMP(t, rx.name, "Tcp", "OutRsts") > rsts })
		if got := netnstest.SNMP(t, rx.name, "Tcp", "InCsumErrors"); got != csumErrs {
			t.Errorf("answer %d: InCsumErrors moved %d -> %d", i, csumErrs, got)
		}
		bad := bytes.Clone(f)
		bad[14+20+16] ^= 0x5a
		rx.inject(t, bad)
		testenv.Eventually(t, "the spoiled copy counted as a checksum error", 3*time.Second, func() bool {
			return netnstest.SNMP(t, rx.name, "Tcp", "InCsumErrors") > csumErrs
		})
		// The IP header checksum too: a spoiled one is dropped before TCP.
		ipBad := bytes.Clone(f)
		ipBad[14+10] ^= 0x5a
		hdrErrs := netnstest.SNMP(t, rx.name, "Ip", "InHdrErrors")
		rx.inject(t, ipBad)
		testenv.Eventually(t, "the spoiled IP header counted", 3*time.Second, func() bool { return netnstest.SNMP(t, rx.name, "Ip", "InHdrErrors") > hdrErrs })
	}
}

// TestPrivilegedKeepaliveHelperKeepsAConnectionWhosePeerIsAway runs a real
// TCP connection between two namespaces; b's socket probes with aggressive
// keepalives (idle 1 s, interval 1 s, 2 probes). a is then unreachable for
// 10 s (a blackhole route for b in a: b's probes arrive, a's answers are
// dropped). Without the helper b's kernel gives up (ETIMEDOUT, the
// control); with the connection marked "peer away" on b, b's own egress
// answers its probes, the socket carries on, and once a is back the
// connection carries data both ways.
func TestPrivilegedKeepaliveHelperKeepsAConnectionWhosePeerIsAway(t *testing.T) {
	for _, helper := range []bool{false, true} {
		t.Run(map[bool]string{false: "without helper the connection is reset", true: "with helper it survives"}[helper], func(t *testing.T) {
			keepaliveThroughOutage(t, helper)
		})
	}
}

func keepaliveThroughOutage(t *testing.T, helper bool) {
	a, b := linkedNS(t, "10.8.0.1/24", "10.8.0.2/24")
	db := openIn(t, b, Options{})
	if err := db.AttachInterface("b0"); err != nil {
		t.Fatal(err)
	}

	ln := netnstest.Listen(t, b.name, "10.8.0.2:5001")
	ca := netnstest.Dial(t, a.name, nil, "10.8.0.2:5001", 2*time.Second)
	cb, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer cb.Close()
	if err := cb.(*net.TCPConn).SetKeepAliveConfig(net.KeepAliveConfig{Enable: true, Idle: time.Second, Interval: time.Second, Count: 2}); err != nil {
		t.Fatal(err)
	}
	line := func(from, to net.Conn, msg string) error {
		if _, err := from.Write([]byte(msg)); err != nil {
			return err
		}
		if err := to.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
			return err
		}
		buf := make([]byte, 64)
		k, err := to.Read(buf)
		if err != nil {
			return err
		}
		if string(buf[:k]) != msg {
			return fmt.Errorf("read %q, want %q", buf[:k], msg)
		}
		return nil
	}
	if err := line(ca, cb, "before"); err != nil {
		t.Fatal(err)
	}
	if err := line(cb, ca, "before, back"); err != nil {
		t.Fatal(err)
	}
	v := Virtual{Proto: TCP, Local: netip.MustParseAddrPort(cb.LocalAddr().String()), Remote: netip.MustParseAddrPort(cb.RemoteAddr().String())}
	if helper {
		if err := db.StartKeepalive(v); err != nil {
			t.Fatal(err)
		}
	}

	// a is away for 10 s: b's segments reach it, nothing comes back.
	a.sh(t, "ip", "route", "add", "blackhole", "10.8.0.2/32")
	inSegs := netnstest.SNMP(t, a.name, "Tcp", "InSegs")
	away := time.Now()
	if err := cb.SetReadDeadline(away.Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	_, err = cb.Read(make([]byte, 64))
	// What reached a meanwhile: b's probes without the helper (which
	// shows the count sees them), nothing with it (answered at b).
	arrived := netnstest.SNMP(t, a.name, "Tcp", "InSegs") - inSegs
	if !helper {
		if !errors.Is(err, syscall.ETIMEDOUT) {
			t.Fatalf("without the helper, b's read ended with %v after %v; want ETIMEDOUT (keepalive gave up)", err, time.Since(away))
		}
		if arrived < 2 {
			t.Errorf("without the helper %d of b's segments reached a, want its probes (at least 2)", arrived)
		}
		t.Logf("without the helper b's connection timed out after %v", time.Since(away).Round(100*time.Millisecond))
		return
	}
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("with the helper, b's read ended with %v after %v; want the 10 s deadline", err, time.Since(away))
	}
	if arrived != 0 {
		t.Errorf("with the helper %d segments reached a during the outage, want none (the probes are answered at b)", arrived)
	}
	answered, ok, err := db.KeepaliveAnswered(v)
	if err != nil || !ok || answered < 5 {
		t.Fatalf("the helper answered %d probes in 10 s (%v, %v); want at least 5", answered, ok, err)
	}
	a.sh(t, "ip", "route", "del", "blackhole", "10.8.0.2/32")
	if _, err := db.StopKeepalive(v); err != nil {
		t.Fatal(err)
	}
	if err := line(ca, cb, "after"); err != nil {
		t.Fatalf("a to b after the outage: %v", err)
	}
	if err := line(cb, ca, "after, back"); err != nil {
		t.Fatalf("b to a after the outage: %v", err)
	}
	c, err := db.Counters()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the helper answered %d probes in 10 s; counters %v", answered, c)
}
