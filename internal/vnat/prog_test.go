package vnat

import (
	"bytes"
	"sort"
	"testing"

	"github.com/cilium/ebpf"
)

// The connection in every row: this end A (virtual 10.9.1.2:40000) talks
// to B (virtual 10.9.2.2:5001). A moved to 10.9.3.2 and got port 40001
// there (its old one was taken); B moved to 10.9.4.2.
var (
	vA, vB   = ap("10.9.1.2:40000"), ap("10.9.2.2:5001")
	pA, pB   = ap("10.9.3.2:40001"), ap("10.9.4.2:5001")
	otherApp = ap("10.9.1.2:40002") // another connection of A's, never moved
)

const tcxNext = 0xffffffff // -1: tcx "next", what both programs return

func TestPrivilegedTranslationRewritesMigratedConnectionsBothWays(t *testing.T) {
	n := newTestNS(t)
	d := openIn(t, n, Options{})
	egress, ingress, _ := d.Programs()

	type move struct {
		name string
		phys Physical // for virtual {proto, vA, vB}
	}
	moves := []move{
		{"local end moved", Physical{Local: pA, Remote: vB}},
		{"remote end moved", Physical{Local: vA, Remote: pB}},
		{"both ends moved", Physical{Local: pA, Remote: pB}},
	}
	for _, proto := range []Proto{TCP, UDP} {
		for _, m := range moves {
			t.Run(proto.String()+"/"+m.name, func(t *testing.T) {
				v := Virtual{Proto: proto, Local: vA, Remote: vB}
				p := m.phys
				p.Proto = proto
				if err := d.Translate(v, p); err != nil {
					t.Fatal(err)
				}
				defer func() {
					if err := d.Forget(v); err != nil {
						t.Fatal(err)
					}
				}()
				before, err := d.Counters()
				if err != nil {
					t.Fatal(err)
				}
				// What A's socket writes goes out physical.
				in := pkt{proto: proto, src: vA, dst: vB, payload: "virtual out"}.build(t)
				want := pkt{proto: proto, src: p.Local, dst: p.Remote, payload: "virtual out"}.build(t)
				ret, got := run(t, egress, in)
				if ret != tcxNext || !bytes.Equal(got, want) {
					t.Errorf("egress: verdict %#x\n got %x\nwant %x", ret, got, want)
				}
				// What arrives physical reaches the socket virtual.
				in = pkt{proto: proto, src: p.Remote, dst: p.Local, payload: "physical in"}.build(t)
				want = pkt{proto: proto, src: vB, dst: vA, payload: "physical in"}.build(t)
				ret, got = run(t, ingress, in)
				if ret != tcxNext || !bytes.Equal(got, want) {
					t.Errorf("ingress: verdict %#x\n got %x\nwant %x", ret, got, want)
				}
				after, err := d.Counters()
				if err != nil {
					t.Fatal(err)
				}
				if after["egress_translated"]-before["egress_translated"] != 1 ||
					after["ingress_translated"]-before["ingress_translated"] != 1 ||
					after["translate_errors"] != before["translate_errors"] {
					t.Errorf("counters before %v after %v: want one translation each way, no errors", before, after)
				}
			})
		}
	}

	t.Run("udp without checksum keeps none", func(t *testing.T) {
		v := Virtual{Proto: UDP, Local: vA, Remote: vB}
		p := Physical{Proto: UDP, Local: pA, Remote: pB}
		if err := d.Translate(v, p); err != nil {
			t.Fatal(err)
		}
		defer d.Forget(v)
		in := pkt{proto: UDP, src: vA, dst: vB, payload: "x", udpNoCsum: true}.build(t)
		want := pkt{proto: UDP, src: pA, dst: pB, payload: "x", udpNoCsum: true}.build(t)
		if _, got := run(t, egress, in); !bytes.Equal(got, want) {
			t.Errorf("got %x\nwant %x", got, want)
		}
	})
}

func TestPrivilegedUntranslatedPacketsLeaveByteIdentical(t *testing.T) {
	n := newTestNS(t)
	d := openIn(t, n, Options{})
	egress, ingress, _ := d.Programs()
	frames := map[string][]byte{
		"tcp of another connection":      pkt{proto: TCP, src: otherApp, dst: vB, payload: "a"}.build(t),
		"udp of another connection":      pkt{proto: UDP, src: otherApp, dst: vB, payload: "a"}.build(t),
		"icmp between the same hosts":    pkt{src: vA, dst: vB, payload: "ping"}.build(t),
		"first fragment of migrated":     pkt{proto: UDP, src: vA, dst: vB, payload: "frag", moreFrags: true}.build(t),
		"later fragment of migrated":     pkt{proto: UDP, src: vA, dst: vB, payload: "frag", fragOffset: 3}.build(t),
		"arp":                            arpFrame(t),
		"physical tuple, wrong hook":     pkt{proto: TCP, src: pA, dst: pB, payload: "a"}.build(t),
		"truncated before the ports":     pkt{proto: TCP, src: vA, dst: vB}.build(t)[:14+20+2],
		"migrated tuple, udp not tcp":    pkt{proto: UDP, src: vA, dst: vB, payload: "a"}.build(t),
		"ipv6 ethertype, ipv4 payload":   ipv6Tagged(pkt{proto: TCP, src: vA, dst: vB}.build(t)),
		"migrated tuple as ingress sees": pkt{proto: TCP, src: vA, dst: vB, payload: "a"}.build(t),
	}
	names := make([]string, 0, len(frames))
	for name := range frames {
		names = append(names, name)
	}
	sort.Strings(names)
	check := func(t *testing.T, hook string) {
		for _, name := range names {
			f := frames[name]
			for _, h := range []struct {
				dir  string
				prog *ebpf.Program
			}{{"egress", egress}, {"ingress", ingress}} {
				if h.dir == "egress" && name == "migrated tuple as ingress sees" {
					continue // on egress that one is the migrated connection itself
				}
				ret, got := run(t, h.prog, f)
				if ret != tcxNext || !bytes.Equal(got, f) {
					t.Errorf("%s, %s %s: verdict %#x, frame changed:\n got %x\nwant %x", hook, h.dir, name, ret, got, f)
				}
			}
		}
	}
	t.Run("nothing migrated", func(t *testing.T) { check(t, "nothing migrated") })

	// One TCP connection migrated, both ends moved: the flag is up, every
	// packet is parsed and looked up, and still none of these may change.
	v := Virtual{Proto: TCP, Local: vA, Remote: vB}
	if err := d.Translate(v, Physical{Proto: TCP, Local: pA, Remote: pB}); err != nil {
		t.Fatal(err)
	}
	before, err := d.Counters()
	if err != nil {
		t.Fatal(err)
	}
	t.Run("one connection migrated", func(t *testing.T) { check(t, "one migrated") })
	after, err := d.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if after["egress_translated"] != before["egress_translated"] || after["ingress_translated"] != before["ingress_translated"] {
		t.Errorf("a translation was counted for untranslated packets: before %v after %v", before, after)
	}
	if got := after["fragments_skipped"] - before["fragments_skipped"]; got != 4 {
		t.Errorf("fragments_skipped moved by %d, want 4 (two fragments, both hooks)", got)
	}
}

// ipv6Tagged relabels a frame's EtherType as IPv6 (the program must not
// read an IPv4 header behind it).
func ipv6Tagged(f []byte) []byte {
	f = bytes.Clone(f)
	f[12], f[13] = 0x86, 0xdd
	return f
}
