package cnilink

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/internal/cni"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/netns"
	"github.com/onehop/onehop/internal/netns/netnstest"
	"github.com/onehop/onehop/internal/testenv"
)

// TestPrivilegedContainerLinkStaysDownUntilUpAndGoesWithoutATrace runs the
// kernel half of the plugin in a namespace standing for the host: the veth
// is made with the container's end named, addressed and routed, the host
// end down (WaitUp waits, and says so when it gives up), up once someone
// else (the agent) brings it up, and Delete removes both ends, twice.
// When WaitUp returns, the container's end can send: the first frame it
// sends at once (the ARP request of a datagram to the gateway) is not
// dropped, and it arrives on the host end.
func TestPrivilegedContainerLinkStaysDownUntilUpAndGoesWithoutATrace(t *testing.T) {
	testenv.RequireRoot(t, "creates namespaces and veths")
	host, ctr := netnstest.New(t, "cnih"), netnstest.New(t, "cnic")
	ctrPath := netns.Path(ctr)
	vm := intent.VM{Farm: "blue", Subnet: "web", Name: "c0123456789", Interface: "vif-c0123456789",
		IP: "10.1.1.5", MAC: "0a:58:0a:01:01:05", Gateway: "10.1.1.1"}
	spec := cni.LinkSpec{HostIf: vm.Interface, Netns: ctrPath, IfName: "eth0", MAC: vm.MAC,
		Address: netip.MustParsePrefix("10.1.1.5/24"), Gateway: netip.MustParseAddr("10.1.1.1")}
	var l Links
	if !l.NetnsExists(ctrPath) || l.NetnsExists(ctrPath+"-gone") {
		t.Fatalf("NetnsExists is wrong about %s or %s-gone", ctrPath, ctrPath)
	}
	err := netns.Do(host, func() error {
		mac, err := l.Add(spec)
		if err != nil || mac == "" {
			return fmt.Errorf("Add: %q, %v", mac, err)
		}
		st, err := l.Inspect(vm.Interface, ctrPath, "eth0")
		if err != nil {
			return err
		}
		if st.HostUp || !st.PeerFound {
			return fmt.Errorf("after Add: %+v, want the host end down and eth0 its peer", st)
		}
		// As made, CHECK fails on the one thing left to the agent.
		if err := cni.CheckLink(vm, "eth0", st); err == nil || !strings.Contains(err.Error(), "the agent has not attached") {
			return fmt.Errorf("CheckLink before the agent: %v", err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		err = l.WaitUp(ctx, vm.Interface, ctrPath, "eth0")
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "still down") {
			return fmt.Errorf("WaitUp with nobody to bring it up: %v", err)
		}
		// The container's socket, ready before the link comes up.
		var sock int
		if err := netns.Do(ctr, func() (err error) {
			sock, err = unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
			return err
		}); err != nil {
			return err
		}
		defer unix.Close(sock)
		// The agent's part, from another thread, bound to the host's
		// namespace as the agent is.
		go func() {
			h, err := netns.Handle(host)
			if err != nil {
				t.Error(err)
				return
			}
			defer h.Close()
			lk, err := h.LinkByName(vm.Interface)
			if err == nil {
				err = h.LinkSetUp(lk)
			}
			if err != nil {
				t.Error(err)
			}
		}()
		ctx, cancel = context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := l.WaitUp(ctx, vm.Interface, ctrPath, "eth0"); err != nil {
			return fmt.Errorf("WaitUp once it is brought up: %v", err)
		}
		// At once, as a container started when ADD returns does: the
		// ARP request for the gateway is the first frame eth0 sends.
		if err := unix.Sendto(sock, []byte("first"), 0, &unix.SockaddrInet4{Port: 9, Addr: spec.Gateway.As4()}); err != nil {
			return fmt.Errorf("the container's first datagram: %v", err)
		}
		if err := firstFrameSent(host, ctr, vm.Interface); err != nil {
			return err
		}
		if st, err = l.Inspect(vm.Interface, ctrPath, "eth0"); err != nil {
			return err
		}
		if err := cni.CheckLink(vm, "eth0", st); err != nil {
			return fmt.Errorf("CheckLink of the link as made and brought up: %v (%+v)", err, st)
		}
		own := spec
		own.Netns = netns.Path(host)
		if _, err := l.Add(own); err == nil || !strings.Contains(err.Error(), "the host's own network namespace") {
			return fmt.Errorf("Add into the host's own namespace: %v, want it refused", err)
		}
		if _, err := l.Add(spec); err == nil || !strings.Contains(err.Error(), "already has an interface eth0") {
			return fmt.Errorf("a second Add: %v, want it refused naming eth0", err)
		}
		for i := 0; i < 2; i++ {
			if err := l.Delete(vm.Interface, ctrPath, "eth0"); err != nil {
				return fmt.Errorf("Delete #%d: %v", i+1, err)
			}
		}
		if err := l.Delete(vm.Interface, "", "eth0"); err != nil {
			return fmt.Errorf("Delete without a namespace: %v", err)
		}
		if st, err = l.Inspect(vm.Interface, ctrPath, "eth0"); err != nil || st.HostKind != "" {
			return fmt.Errorf("after Delete: %+v, %v", st, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	h, err := netns.Handle(ctr)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if _, err := h.LinkByName("eth0"); err == nil {
		t.Error("after Delete the container still has eth0")
	}
}

// firstFrameSent checks the container's first frame: eth0 dropped none
// (the kernel drops what a veth end sends before it has activated the
// end's queue, which it does after the carrier comes, on its own time)
// and the host end received it (a veth counts both as it sends).
func firstFrameSent(host, ctr, hostIf string) error {
	stats := func(ns, ifname string) (*netlink.LinkStatistics, error) {
		h, err := netns.Handle(ns)
		if err != nil {
			return nil, err
		}
		defer h.Close()
		l, err := h.LinkByName(ifname)
		if err != nil {
			return nil, err
		}
		return l.Attrs().Statistics, nil
	}
	st, err := stats(ctr, "eth0")
	if err != nil {
		return err
	}
	hs, err := stats(host, hostIf)
	if err != nil {
		return err
	}
	if st.TxDropped != 0 || hs.RxPackets == 0 {
		return fmt.Errorf("right after WaitUp returned, eth0 sent %d frame(s) and dropped %d, %s received %d: the container could not send yet",
			st.TxPackets, st.TxDropped, hostIf, hs.RxPackets)
	}
	return nil
}
