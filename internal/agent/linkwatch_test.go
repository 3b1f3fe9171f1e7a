package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"sort"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/internal/datapath"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/netns"
	"github.com/onehop/onehop/internal/netns/netnstest"
	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/testenv"
)

// fakeLinks is a subscription the test feeds by hand.
type fakeLinks struct {
	subs chan chan<- netlink.LinkUpdate
	errs chan func(error)
}

func (f *fakeLinks) SubscribeLinks(updates chan<- netlink.LinkUpdate, _ <-chan struct{}, onError func(error)) error {
	f.errs <- onError
	f.subs <- updates
	return nil
}

func linkUpdate(typ uint16, idx int32, name string, flags uint32) netlink.LinkUpdate {
	u := netlink.LinkUpdate{Link: &netlink.Tuntap{LinkAttrs: netlink.LinkAttrs{Name: name, Index: int(idx)}}}
	u.Header.Type, u.Index, u.Flags = typ, idx, flags
	return u
}

func TestALinkThatAppearsGoesOrIsMadeAgainKicksAPassAndFlagsDoNot(t *testing.T) {
	names := map[int32]string{}
	steps := []struct {
		u    netlink.LinkUpdate
		kick bool
	}{
		{linkUpdate(unix.RTM_NEWLINK, 7, "tapg1", 0), true},                 // appeared
		{linkUpdate(unix.RTM_NEWLINK, 7, "tapg1", unix.IFF_UP), false},      // brought up
		{linkUpdate(unix.RTM_NEWLINK, 7, "tapg2", unix.IFF_UP), true},       // renamed
		{linkUpdate(unix.RTM_DELLINK, 7, "tapg2", 0), true},                 // gone
		{linkUpdate(unix.RTM_NEWLINK, 9, "tapg2", 0), true},                 // made again
		{linkUpdate(unix.RTM_NEWLINK, 9, "tapg2", unix.IFF_RUNNING), false}, // carrier
	}
	for i, s := range steps {
		if got := renamed(names, s.u); got != s.kick {
			t.Fatalf("step %d (%s %d): kick %v, want %v", i, s.u.Link.Attrs().Name, s.u.Index, got, s.kick)
		}
	}
}

func TestALostLinkSubscriptionIsMadeAgainAndKicksAPass(t *testing.T) {
	a := newAgent(t, store.NewMemory(), &fakeDatapath{}, fakeInterfaces{"uplink0": 2})
	src := &fakeLinks{subs: make(chan chan<- netlink.LinkUpdate, 1), errs: make(chan func(error), 1)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); a.watchLinks(ctx, src) }()
	defer func() { cancel(); <-done }()
	kicked := func(what string) {
		t.Helper()
		select {
		case <-a.linkKick:
		case <-time.After(5 * time.Second):
			t.Fatalf("no pass kicked: %s", what)
		}
	}
	onError, updates := <-src.errs, <-src.subs
	kicked("subscribed")
	updates <- linkUpdate(unix.RTM_NEWLINK, 7, "tapg1", 0)
	kicked("tapg1 appeared")
	onError(errors.New("ENOBUFS"))
	close(updates)
	// Subscribed again after a pause: events may have been lost, so a pass.
	<-src.errs
	updates = <-src.subs
	kicked("subscribed again")
	updates <- linkUpdate(unix.RTM_NEWLINK, 7, "tapg1", 0) // known no more: the table was lost too
	kicked("tapg1 seen again")
	close(updates)
}

// linkWatchNS, in the environment, makes the privileged test below the
// child it runs inside the host namespace; its value is the fabric's
// namespace, where the uplink's peer is.
const linkWatchNS = "ONEHOP_AGENT_LINKWATCH_FABRIC"

// TestPrivilegedAGuestTapIsAttachedWhenItAppearsAndSilentUntilThen runs an
// agent (real datapath, netlink and link events; the store in memory) with
// a resync of an hour, so only the link event can explain an attach. A
// test process plays QEMU: it opens a tap (down, as QEMU's with
// script=no) and writes a guest's frames as fast as it can until one is
// taken. None is taken before the program is attached; the uplink's peer
// sees none of them; the tap is deleted and made again, 20 times, and the
// window (tap made -> program attached) is logged.
func TestPrivilegedAGuestTapIsAttachedWhenItAppearsAndSilentUntilThen(t *testing.T) {
	fabric := os.Getenv(linkWatchNS)
	if fabric == "" {
		testenv.RequireRoot(t, "namespaces, BPF and taps")
		testenv.RequireTool(t, "ip")
		// The agent's netlink calls act in their thread's namespace: the
		// whole process must be in the host's, so the test runs again
		// inside it.
		host, fab := netnstest.New(t, "lw-host"), netnstest.New(t, "lw-fab")
		netnstest.Veth(t, "uplink0", host, "peer0", fab)
		netnstest.IP(t, host, "addr", "add", "192.168.100.1/24", "dev", "uplink0")
		cmd := exec.Command("ip", "netns", "exec", host, os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1", "-test.v")
		cmd.Env = append(os.Environ(), linkWatchNS+"="+fab)
		out, err := cmd.CombinedOutput()
		t.Logf("in %s:\n%s", host, out)
		if err != nil || !bytes.Contains(out, []byte("--- PASS: "+t.Name())) {
			t.Fatalf("in the host's namespace: %v", err)
		}
		return
	}
	const guestMAC, tapName = "02:00:0a:01:01:09", "tapg1"
	k, err := datapath.Open("", datapath.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer k.Close()
	s := store.NewMemory()
	putDesired(t, s, "h1", intent.Desired{VMNet: "10.0.0.0/8", Local: []intent.LocalEndpoint{
		{Name: "blue/web/g1", IP: "10.1.1.9", MAC: guestMAC, Interface: tapName}}})
	a, err := New(Config{Node: "h1", Uplink: "uplink0", Resync: time.Hour}, s, k, LinkTable{}, quiet())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- a.Run(ctx) }()
	defer func() { cancel(); <-ran }()
	missing := func() error {
		st, _, _ := a.Status()
		if len(st.MissingVifs) != 1 || st.MissingVifs[0] != tapName {
			return fmt.Errorf("missing vifs %v", st.MissingVifs)
		}
		return nil
	}
	testenv.Eventually(t, "the agent to wait for "+tapName, 10*time.Second, missing)

	mac, _ := net.ParseMAC(guestMAC)
	capture := captureFrom(t, fabric, "peer0", mac)
	frame := arpRequest(mac, [4]byte{10, 1, 1, 9}, [4]byte{192, 168, 100, 1}) // the host's own address

	const runs = 20
	windows := make([]time.Duration, 0, runs)
	silentRuns := 0
	for run := range runs {
		made := time.Now()
		fd := openTapFd(t, tapName)
		l, err := netlink.LinkByName(tapName)
		if err != nil {
			t.Fatal(err)
		}
		idx := l.Attrs().Index
		var attached time.Duration
		refused := 0
		for {
			if attached == 0 && tcxCount(t, idx) > 0 {
				attached = time.Since(made)
			}
			_, err := unix.Write(fd, frame)
			if err == nil {
				break
			}
			if !errors.Is(err, unix.EIO) {
				t.Fatalf("run %d: write to the tap: %v", run, err)
			}
			refused++
			if time.Since(made) > 5*time.Second {
				t.Fatalf("run %d: %s not attached and up 5 s after it appeared (resync is an hour)", run, tapName)
			}
		}
		// Taken: the program must have been on it already (it is attached
		// before the tap comes up, and stays).
		if tcxCount(t, idx) == 0 {
			t.Fatalf("run %d: a frame was taken by %s with no program attached", run, tapName)
		}
		if attached == 0 {
			attached = time.Since(made) // attached and up between two checks
		}
		windows = append(windows, attached)
		l, err = netlink.LinkByIndex(idx)
		if err != nil {
			t.Fatal(err)
		}
		st := l.Attrs().Statistics
		// Refused writes are rx_dropped: the kernel took none of them. The
		// one taken is the positive control: the device received it, so the
		// program at its ingress ran on it.
		if st.RxDropped != uint64(refused) || st.RxPackets != 1 {
			t.Fatalf("run %d: %d writes refused; the tap's rx packets %d dropped %d", run, refused, st.RxPackets, st.RxDropped)
		}
		// A run whose first write comes after the agent attached and
		// brought the tap up (the test was descheduled for those ~10 ms)
		// refuses nothing and proves nothing of the window: legitimate,
		// so only the runs together must show refusals.
		if refused > 0 {
			silentRuns++
		}
		unix.Close(fd) // deletes the tap
		testenv.Eventually(t, "the agent to see "+tapName+" gone", 5*time.Second, missing)
	}
	if silentRuns == 0 {
		t.Fatalf("in none of %d runs did the guest write before its program was attached: the window was never tested", runs)
	}
	if n := capture.guestFrames(); n != 0 {
		t.Fatalf("the uplink's peer saw %d frames from the guest", n)
	}
	// Positive control of the capture: a frame with the guest's source
	// sent out of the uplink is seen.
	sendOut(t, "uplink0", frame)
	testenv.Eventually(t, "the capture to see a guest's frame sent out of the uplink", 5*time.Second, func() error {
		if capture.guestFrames() == 0 {
			return errors.New("none seen")
		}
		return nil
	})
	sort.Slice(windows, func(i, j int) bool { return windows[i] < windows[j] })
	t.Logf("tap made -> program attached, %d runs: p50 %v, max %v", runs, windows[runs/2], windows[runs-1])
}

// openTapFd makes tap device name (down, IFF_TAP|IFF_NO_PI) in this
// namespace and returns its fd; closing it deletes the device.
func openTapFd(t *testing.T, name string) int {
	t.Helper()
	fd, err := netns.OpenTap("", name, false)
	if err != nil {
		t.Fatal(err)
	}
	return fd
}

func tcxCount(t *testing.T, ifindex int) int {
	t.Helper()
	r, err := link.QueryPrograms(link.QueryOptions{Target: ifindex, Attach: ebpf.AttachTCXIngress})
	if err != nil {
		return 0 // gone, or not yet anything on it
	}
	return len(r.Programs)
}

// arpRequest is an ARP request from mac/ip for target, broadcast.
func arpRequest(mac net.HardwareAddr, ip, target [4]byte) []byte {
	f := append([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, mac...)
	f = append(f, 0x08, 0x06, 0, 1, 8, 0, 6, 4, 0, 1)
	f = append(f, mac...)
	f = append(f, ip[:]...)
	f = append(f, 0, 0, 0, 0, 0, 0)
	return append(f, target[:]...)
}

// sendOut sends frame out of ifname in this namespace.
func sendOut(t *testing.T, ifname string, frame []byte) {
	t.Helper()
	l, err := netlink.LinkByName(ifname)
	if err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Sendto(fd, frame, 0, &unix.SockaddrLinklayer{Ifindex: l.Attrs().Index, Halen: 6}); err != nil {
		t.Fatal(err)
	}
}

// capture counts the frames from one MAC (as Ethernet source or ARP
// sender) that reach an interface, until the test ends.
type capture struct {
	n chan int
}

func (c *capture) guestFrames() int { return <-c.n }

func captureFrom(t *testing.T, ns, ifname string, mac net.HardwareAddr) *capture {
	t.Helper()
	var fd int
	err := netns.Do(ns, func() error {
		l, err := netlink.LinkByName(ifname)
		if err != nil {
			return err
		}
		proto := int(htons(unix.ETH_P_ALL))
		if fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto); err != nil {
			return err
		}
		return unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: l.Attrs().Index})
	})
	if err != nil {
		t.Fatalf("capture on %s in %s: %v", ifname, ns, err)
	}
	tv := unix.Timeval{Usec: 100000}
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		t.Fatal(err)
	}
	c := &capture{n: make(chan int)}
	stop := make(chan struct{})
	done := make(chan struct{})
	frames := make(chan []byte)
	go func() {
		defer close(done)
		b := make([]byte, 65536)
		for {
			select {
			case <-stop:
				return
			default:
			}
			n, _, err := unix.Recvfrom(fd, b, 0)
			if err == nil {
				frames <- append([]byte(nil), b[:n]...)
			}
		}
	}()
	go func() {
		count := 0
		for {
			select {
			case f := <-frames:
				if bytes.Equal(f[6:12], mac) || (len(f) >= 28 && bytes.Equal(f[12:14], []byte{8, 6}) && bytes.Equal(f[22:28], mac)) {
					count++
				}
			case c.n <- count:
			case <-stop:
				return
			}
		}
	}()
	t.Cleanup(func() {
		close(stop)
		// The reader may be handing a frame over: take it.
		go func() {
			for range frames {
			}
		}()
		<-done
		unix.Close(fd)
	})
	return c
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
