package arpengine

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/csum"
)

var (
	hostMAC = net.HardwareAddr{0xaa, 0, 0, 0, 0, 1}
	h2      = net.HardwareAddr{0xaa, 0, 0, 0, 0, 2}
	h3      = net.HardwareAddr{0xaa, 0, 0, 0, 0, 3}
	hostIP  = netip.MustParseAddr("192.168.100.10")
	db1     = netip.MustParseAddr("10.1.2.2")
)

type fakeTable struct {
	entries map[netip.Addr]Entry
}

func (f *fakeTable) Mappings() ([]Entry, error) {
	var out []Entry
	for _, e := range f.entries {
		out = append(out, e)
	}
	return out, nil
}

func (f *fakeTable) Mapping(ip netip.Addr) (net.HardwareAddr, bool) {
	e, ok := f.entries[ip]
	return e.HostMAC, ok && e.HostMAC != nil
}

func (f *fakeTable) ForgetMapping(ip netip.Addr) error { delete(f.entries, ip); return nil }
func (f *fakeTable) MappingCapacity() int              { return 1024 }

type rig struct {
	t     *testing.T
	e     *Engine
	table *fakeTable
	sent  [][]byte
	clock time.Duration
}

func newRig(t *testing.T, cfg Config) *rig {
	r := &rig{t: t, table: &fakeTable{entries: map[netip.Addr]Entry{}}, clock: time.Hour}
	cfg.HostMAC, cfg.HostIP = hostMAC, hostIP
	e, err := New(cfg, r.table, func(f []byte) error { r.sent = append(r.sent, append([]byte(nil), f...)); return nil },
		func() time.Duration { return r.clock }, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	r.e = e
	return r
}

// takeSent returns and clears what the engine sent.
func (r *rig) takeSent() [][]byte {
	s := r.sent
	r.sent = nil
	return s
}

// heldFrame is a routed frame towards ip as the datapath hands it over:
// complete, destination MAC not yet known.
func heldFrame(ip netip.Addr, payload byte) []byte {
	f := make([]byte, 14+20+8)
	copy(f[6:12], hostMAC)
	f[12], f[13] = 0x08, 0x00
	f[14] = 0x45
	d := ip.As4()
	copy(f[30:34], d[:])
	f[len(f)-1] = payload
	return f
}

func TestFirstPacketAsksTheSubnetAndIsReleasedWhenAnswered(t *testing.T) {
	r := newRig(t, Config{})
	var observed []string
	r.e.Observe(func(answered bool, vm netip.Addr, host net.HardwareAddr) {
		observed = append(observed, fmt.Sprint(answered, vm, host))
	})
	r.e.Hold(heldFrame(db1, 1), 42)
	r.e.Hold(heldFrame(db1, 2), 42)
	sent := r.takeSent()
	if len(sent) != 1 {
		t.Fatalf("%d questions for one address, want 1", len(sent))
	}
	if want := Request(ScopeMAC(db1), hostMAC, hostIP, db1); !bytes.Equal(sent[0], want) {
		t.Fatalf("question\n got %x\nwant %x", sent[0], want)
	}
	if !bytes.Equal(sent[0][0:6], []byte{0x03, 0, 10, 1, 2, 0}) {
		t.Fatalf("question went to %x, want the farm 1 subnet 2 multicast address", sent[0][0:6])
	}
	r.e.Answered(Answer{VM: db1, HostMAC: h2})
	sent = r.takeSent()
	if len(sent) != 2 || sent[0][41] != 1 || sent[1][41] != 2 {
		t.Fatalf("released %d frames, want both held frames in order", len(sent))
	}
	for _, f := range sent {
		if !bytes.Equal(f[0:6], h2) {
			t.Fatalf("released frame to %x, want h2", f[0:6])
		}
	}
	st := r.e.Stats()
	if st.MulticastRequests != 1 || st.Resolved != 1 || st.Held != 2 || st.Released != 2 {
		t.Fatalf("stats %+v", st)
	}
	// onehop observe hears the question and the answer.
	want := []string{fmt.Sprint(false, db1, ScopeMAC(db1)), fmt.Sprint(true, db1, net.HardwareAddr(h2))}
	if !slices.Equal(observed, want) {
		t.Fatalf("observed %q, want %q", observed, want)
	}
}

func TestUnansweredAddressIsRetriedThenRefusedForAWhile(t *testing.T) {
	r := newRig(t, Config{Tries: 3, Wait: 100 * time.Millisecond, Negative: time.Second})
	r.e.Hold(heldFrame(db1, 1), 42)
	for i := 0; i < 5; i++ {
		r.clock += 100 * time.Millisecond
		r.e.Retry()
	}
	if n := len(r.takeSent()); n != 3 {
		t.Fatalf("%d questions, want 3 tries", n)
	}
	r.e.Hold(heldFrame(db1, 2), 42)
	if n := len(r.takeSent()); n != 0 {
		t.Fatalf("asked again for an address that just went unanswered (%d)", n)
	}
	st := r.e.Stats()
	if st.Unresolved != 1 || st.Discarded != 2 {
		t.Fatalf("stats %+v", st)
	}
	r.clock += 2 * time.Second
	r.e.Retry()
	r.e.Hold(heldFrame(db1, 3), 42)
	if n := len(r.takeSent()); n != 1 {
		t.Fatalf("after the negative time, %d questions, want 1", n)
	}
}

func TestQueueIsBoundedAndCutFramesAreNotKept(t *testing.T) {
	r := newRig(t, Config{Queue: 2})
	for i := 0; i < 4; i++ {
		r.e.Hold(heldFrame(db1, byte(i)), 42)
	}
	r.e.Hold(heldFrame(db1, 9), 9000) // a superpacket cut by the hand-over
	r.takeSent()
	r.e.Answered(Answer{VM: db1, HostMAC: h2})
	if n := len(r.takeSent()); n != 2 {
		t.Fatalf("released %d, want the queue's 2", n)
	}
	if st := r.e.Stats(); st.Discarded != 3 || st.Held != 2 {
		t.Fatalf("stats %+v", st)
	}
}

func TestForgottenEntryIsAskedAtItsLastHostFirst(t *testing.T) {
	r := newRig(t, Config{Wait: 100 * time.Millisecond})
	r.table.entries[db1] = Entry{IP: db1, HostMAC: h3, Confirmed: r.clock, Used: r.clock}
	r.e.Sweep()                     // the engine sees where db1 lives
	delete(r.table.entries, db1)    // and the LRU forgets it
	r.e.Hold(heldFrame(db1, 1), 42) // then db1 is wanted again
	r.clock += 100 * time.Millisecond
	r.e.Retry()
	sent := r.takeSent()
	if len(sent) != 2 || !bytes.Equal(sent[0][0:6], h3) || !bytes.Equal(sent[1][0:6], ScopeMAC(db1)) {
		t.Fatalf("questions went to %x: want h3, then the subnet multicast address", destinations(sent))
	}
	if st := r.e.Stats(); st.UnicastRequests != 1 || st.MulticastRequests != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func destinations(fs [][]byte) [][]byte {
	var out [][]byte
	for _, f := range fs {
		out = append(out, f[0:6])
	}
	return out
}

func TestSweepRefreshesEntriesInUseAndForgetsTheRest(t *testing.T) {
	r := newRig(t, Config{Refresh: 60 * time.Second, Idle: 5 * time.Minute, Wait: 200 * time.Millisecond, Tries: 3})
	now := r.clock
	idle := netip.MustParseAddr("10.1.1.9")
	stale := netip.MustParseAddr("10.1.1.10")
	gone := netip.MustParseAddr("10.1.1.11")
	asked := netip.MustParseAddr("10.1.1.12")
	r.table.entries = map[netip.Addr]Entry{
		idle:  {IP: idle, HostMAC: h2, Confirmed: now - 10*time.Minute, Used: now - 6*time.Minute},
		stale: {IP: stale, HostMAC: h2, Confirmed: now - 61*time.Second, Used: now - time.Second},
		gone:  {IP: gone, HostMAC: h3, Confirmed: now - 61*time.Second, Used: now - time.Second},
		asked: {IP: asked, Confirmed: now - 4*time.Second, Used: now - 4*time.Second},
	}
	r.e.Sweep()
	if _, ok := r.table.entries[idle]; ok {
		t.Fatal("an entry unused for 6 minutes is still there")
	}
	if _, ok := r.table.entries[asked]; ok {
		t.Fatal("an unanswered question older than the negative time is still there")
	}
	sent := r.takeSent()
	if len(sent) != 2 {
		t.Fatalf("%d refresh questions, want 2", len(sent))
	}
	for _, f := range sent {
		if !bytes.Equal(f[0:6], h2) && !bytes.Equal(f[0:6], h3) {
			t.Fatalf("refresh question to %x, want the entry's own host first", f[0:6])
		}
	}
	// stale's host answers (the datapath updates Confirmed); gone's does not.
	r.clock += 300 * time.Millisecond
	r.table.entries[stale] = Entry{IP: stale, HostMAC: h2, Confirmed: r.clock, Used: r.clock}
	r.e.Sweep()
	sent = r.takeSent()
	if len(sent) != 1 || !bytes.Equal(sent[0][0:6], ScopeMAC(gone)) {
		t.Fatalf("after the unicast went unanswered: questions to %x, want the subnet multicast address", destinations(sent))
	}
	r.clock += time.Second
	r.e.Sweep()
	if _, ok := r.table.entries[gone]; ok {
		t.Fatal("an entry whose host stopped answering is still there")
	}
	st := r.e.Stats()
	if st.Expired != 1 || st.Refreshed != 1 || st.Lost != 1 || st.Mapped != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func TestStaleEntryNotInUseIsNotAskedAbout(t *testing.T) {
	r := newRig(t, Config{})
	r.table.entries[db1] = Entry{IP: db1, HostMAC: h2, Confirmed: r.clock - 2*DefaultRefresh, Used: r.clock - 2*DefaultRefresh}
	r.e.Sweep()
	if n := len(r.takeSent()); n != 0 {
		t.Fatalf("%d questions about an entry nobody uses", n)
	}
}

func TestAnnouncementIsAGratuitousReplyFromThisHost(t *testing.T) {
	r := newRig(t, Config{})
	web1 := netip.MustParseAddr("10.1.1.2")
	r.e.Announce(web1)
	sent := r.takeSent()
	if len(sent) != 1 {
		t.Fatalf("%d frames", len(sent))
	}
	f := sent[0]
	a, err := ParseAnswer(f)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(f[0:6], Broadcast) || a.VM != web1 || !bytes.Equal(a.HostMAC, hostMAC) || !bytes.Equal(f[14+24:14+28], f[14+14:14+18]) {
		t.Fatalf("announcement %x", f)
	}
}

func TestParseAnswerRejectsWhatIsNoReply(t *testing.T) {
	good := Announcement(hostMAC, db1)
	req := Request(ScopeMAC(db1), hostMAC, hostIP, db1)
	notARP := append([]byte(nil), good...)
	notARP[12] = 0x08
	notARP[13] = 0x00
	for name, f := range map[string][]byte{"short": good[:30], "request": req, "not arp": notARP} {
		if _, err := ParseAnswer(f); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := Destination(good); err == nil {
		t.Error("Destination accepted an ARP frame")
	}
}

func TestConfigThatCannotWorkIsRefused(t *testing.T) {
	if _, err := New(Config{HostMAC: hostMAC, Refresh: time.Second, Wait: time.Second}, &fakeTable{}, nil, nil, nil); err == nil {
		t.Fatal("a refresh shorter than a resolution was accepted")
	}
	if _, err := New(Config{}, &fakeTable{}, nil, nil, nil); err == nil {
		t.Fatal("a missing host MAC was accepted")
	}
}

func TestFinishChecksumMakesTCPAndUDPWhole(t *testing.T) {
	// A UDP datagram 10.1.1.2:40000 -> 10.1.2.2:53 with payload "hi", and
	// its checksum worked out by hand (pseudo-header + header + data).
	f := make([]byte, 14+20+8+2)
	f[12], f[13] = 0x08, 0x00
	ip := f[14:]
	ip[0], ip[8], ip[9] = 0x45, 64, 17
	binary.BigEndian.PutUint16(ip[2:4], 30)
	copy(ip[12:16], []byte{10, 1, 1, 2})
	copy(ip[16:20], []byte{10, 1, 2, 2})
	udp := ip[20:]
	binary.BigEndian.PutUint16(udp[0:2], 40000)
	binary.BigEndian.PutUint16(udp[2:4], 53)
	binary.BigEndian.PutUint16(udp[4:6], 10)
	copy(udp[8:], "hi")
	binary.BigEndian.PutUint16(udp[6:8], 0x1234) // what offload left there
	FinishChecksum(f)
	// Sum over pseudo-header and datagram, checksum included, folds to 0xffff.
	if sum := csum.Sum(csum.Pseudo(ip[12:16], ip[16:20], 17, 10), udp); sum != 0xffff {
		t.Fatalf("checksum %#04x does not verify (sum %#x)", binary.BigEndian.Uint16(udp[6:8]), sum)
	}
	frag := append([]byte(nil), f...)
	binary.BigEndian.PutUint16(frag[14+6:14+8], 0x2000) // more fragments
	binary.BigEndian.PutUint16(frag[14+20+6:], 0x1234)
	FinishChecksum(frag)
	if binary.BigEndian.Uint16(frag[14+20+6:]) != 0x1234 {
		t.Fatal("a fragment's checksum was rewritten")
	}
}

func TestAddressesResolvedAtOnceAreBounded(t *testing.T) {
	r := newRig(t, Config{})
	for i := 0; i < maxPending+10; i++ {
		r.e.Hold(heldFrame(netip.AddrFrom4([4]byte{10, 1, byte(1 + i/250), byte(2 + i%250)}), 1), 42)
	}
	if n := len(r.takeSent()); n != maxPending {
		t.Fatalf("%d questions, want at most %d addresses at once", n, maxPending)
	}
	if st := r.e.Stats(); st.Discarded != 10 {
		t.Fatalf("discarded %d, want 10", st.Discarded)
	}
}

// The datapath learns an answer before the engine hears of it: a packet
// handed over in between must not overtake the ones already held (the later
// fragments of a datagram would reach the other host before its first).
func TestAPacketHeldAfterTheAnswerWasLearnedLeavesAfterThoseHeldBefore(t *testing.T) {
	r := newRig(t, Config{})
	r.e.Hold(heldFrame(db1, 1), 42)
	r.takeSent() // the question
	r.table.entries[db1] = Entry{IP: db1, HostMAC: h2}
	r.e.Hold(heldFrame(db1, 2), 42)
	sent := r.takeSent()
	if len(sent) != 2 || sent[0][41] != 1 || sent[1][41] != 2 {
		t.Fatalf("sent %d frames, want the held one, then the new one", len(sent))
	}
	r.e.Answered(Answer{VM: db1, HostMAC: h2})
	if n := len(r.takeSent()); n != 0 {
		t.Fatalf("the late answer released %d frames again", n)
	}
}
