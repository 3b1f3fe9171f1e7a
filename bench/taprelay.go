package main

// taprelay: the userspace half of a hypervisor's tap backend, run as
// `BENCH taprelay ...` (the bench binary re-executed) for the tapguest
// scenarios. It makes two taps and copies every frame from each one's fd
// to the other's, as QEMU's `-netdev tap` backend copies between its tap
// and the guest's virtio-net queues (without vhost-net, which this machine
// lacks):
//
//   - the host tap, in the host's namespace: the guest interface onehop's
//     agent attaches to (`vm create --interface`), as QEMU's tap is;
//   - the guest tap, named eth0 in the guest's namespace: the guest's NIC,
//     with a whole Linux stack behind it, so iperf3, ping and udhcpc run
//     in the guest unchanged.
//
// With -vnet-hdr both taps carry a virtio_net_hdr in front of each frame
// and accept checksum and TSO offloads, as QEMU does for a virtio-net guest
// that negotiated them: TCP crosses as GSO superpackets, as it would from
// such a guest. Without it every frame is at most 1514 bytes (a guest
// without offloads: e1000, or virtio-net with them off).
//
// It prints "ready" once both taps exist, then relays and answers
// "counters" (one JSON line: frames, bytes and drops each way) until
// "quit" or the end of its input. Exiting closes both fds, which deletes
// both taps.

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/internal/netns"
)

// tapRelayArg is the first argument that makes the bench binary taprelay.
const tapRelayArg = "taprelay"

// relayDir counts one direction of the relay.
type relayDir struct {
	name                   string
	frames, bytes, dropped atomic.Uint64
	firstDrop              atomic.Pointer[string]
}

// relayCounters are one direction's counters as "counters" prints them.
type relayCounters struct {
	Frames    uint64 `json:"frames"`
	Bytes     uint64 `json:"bytes"`
	Dropped   uint64 `json:"dropped"`
	FirstDrop string `json:"firstDrop,omitempty"` // why the first dropped frame was refused
}

func (d *relayDir) counters() relayCounters {
	c := relayCounters{Frames: d.frames.Load(), Bytes: d.bytes.Load(), Dropped: d.dropped.Load()}
	if p := d.firstDrop.Load(); p != nil {
		c.FirstDrop = *p
	}
	return c
}

// tapRelayMain runs taprelay with args (after "taprelay") and returns the
// exit code.
func tapRelayMain(args []string) int {
	fs := flag.NewFlagSet(tapRelayArg, flag.ContinueOnError)
	hostNS := fs.String("host-netns", "", "namespace file of the host (where the guest interface is)")
	hostTap := fs.String("host-tap", "", "the guest interface: the host's tap")
	guestNS := fs.String("guest-netns", "", "namespace file of the guest")
	guestTap := fs.String("guest-tap", "eth0", "the guest's NIC")
	vnetHdr := fs.Bool("vnet-hdr", false, "virtio_net_hdr on both taps, with checksum and TSO offloads (as QEMU with virtio-net)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *hostNS == "" || *hostTap == "" || *guestNS == "" {
		fmt.Fprintln(os.Stderr, "taprelay: -host-netns, -host-tap and -guest-netns are required")
		return 2
	}
	opts := netns.TapOptions{}
	if *vnetHdr {
		opts = netns.TapOptions{VnetHdr: true, Offloads: netns.TunCsum | netns.TunTSO4 | netns.TunTSO6}
	}
	host, err := netns.OpenTapWith(*hostNS, *hostTap, opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "taprelay: host tap:", err)
		return 1
	}
	guest, err := netns.OpenTapWith(*guestNS, *guestTap, opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "taprelay: guest tap:", err)
		return 1
	}
	out := &relayDir{name: "guest->host"}
	in := &relayDir{name: "host->guest"}
	errc := make(chan error, 3)
	go func() { errc <- relay(guest, host, out) }()
	go func() { errc <- relay(host, guest, in) }()
	fmt.Println("ready")
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			switch sc.Text() {
			case "quit":
				errc <- nil
				return
			case "counters":
				json.NewEncoder(os.Stdout).Encode(map[string]relayCounters{out.name: out.counters(), in.name: in.counters()}) //nolint:errcheck // the bench reads it or is gone
			default:
				fmt.Printf("unknown command %q\n", sc.Text())
			}
		}
		errc <- sc.Err()
	}()
	if err := <-errc; err != nil {
		fmt.Fprintln(os.Stderr, "taprelay:", err)
		return 1
	}
	return 0
}

// relay copies frames from src to dst until reading src fails. One read is
// one frame (with its vnet_hdr, if any) and one write sends it whole. A
// frame dst refuses is dropped and counted, as a NIC drops: EIO while dst
// is down (until onehop's agent has attached its program and brought the
// host tap up).
func relay(src, dst int, d *relayDir) error {
	// A vnet_hdr frame may be a 64 KB GSO superpacket plus its header.
	buf := make([]byte, 1<<17)
	for {
		n, err := unix.Read(src, buf)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("%s: read: %w", d.name, err)
		}
		if _, err := unix.Write(dst, buf[:n]); err != nil {
			if d.dropped.Add(1) == 1 {
				s := err.Error()
				d.firstDrop.Store(&s)
			}
			continue
		}
		d.frames.Add(1)
		d.bytes.Add(uint64(n))
	}
}
