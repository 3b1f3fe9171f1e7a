package netns_test

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/netns"
	"github.com/onehop/onehop/internal/netns/netnstest"
	"github.com/onehop/onehop/internal/testenv"
)

// TestPrivilegedATapWithVnetHdrPrefixesFramesAndTakesOffloads opens a tap
// with a vnet_hdr and offloads and a plain one beside it (the control):
// ethtool shows TSO on only on the first, and an ARP request the kernel
// sends out of each is read at offset 10 from the first, 0 from the other.
func TestPrivilegedATapWithVnetHdrPrefixesFramesAndTakesOffloads(t *testing.T) {
	testenv.RequireRoot(t, "creates a network namespace and taps")
	testenv.RequireTool(t, "ethtool", "ping")
	ns := netnstest.New(t, "oh-tapv")
	open := func(name string, o netns.TapOptions) *os.File {
		o.Nonblock = true
		fd, err := netns.OpenTapWith(netns.Path(ns), name, o)
		if err != nil {
			t.Fatal(err)
		}
		f := os.NewFile(uintptr(fd), name)
		t.Cleanup(func() { f.Close() })
		return f
	}
	cases := []struct {
		name   string
		opts   netns.TapOptions
		tso    string
		offset int
		addr   string
		dst    string // an address of its subnet nobody has
	}{
		{"tapv", netns.TapOptions{VnetHdr: true, Offloads: netns.TunCsum | netns.TunTSO4 | netns.TunTSO6}, "on", 10, "10.9.1.1/24", "10.9.1.2"},
		{"tapp", netns.TapOptions{}, "off", 0, "10.9.2.1/24", "10.9.2.2"},
	}
	for _, c := range cases {
		f := open(c.name, c.opts)
		out, err := exec.Command("ip", "netns", "exec", ns, "ethtool", "-k", c.name).CombinedOutput()
		if err != nil {
			t.Fatalf("ethtool -k %s: %v: %s", c.name, err, out)
		}
		if want := "tcp-segmentation-offload: " + c.tso; !strings.Contains(string(out), want) {
			t.Errorf("%s: no %q in ethtool -k:\n%s", c.name, want, out)
		}
		netnstest.IP(t, ns, "addr", "add", c.addr, "dev", c.name)
		netnstest.IP(t, ns, "link", "set", c.name, "up")
		// Its neighbour is unknown: the kernel sends an ARP request out.
		exec.Command("ip", "netns", "exec", ns, "ping", "-c", "1", "-W", "1", c.dst).Run() // it fails: nobody answers
		b := make([]byte, 2048)
		found := false
		for deadline := time.Now().Add(3 * time.Second); !found && time.Now().Before(deadline); {
			f.SetReadDeadline(deadline)
			n, err := f.Read(b)
			if err != nil {
				t.Fatalf("%s: no ARP request read from the fd: %v", c.name, err)
			}
			fr := b[c.offset:n]
			found = len(fr) >= 14 && bytes.Equal(fr[:6], []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}) && fr[12] == 0x08 && fr[13] == 0x06
			if found && c.offset > 0 && !bytes.Equal(b[:c.offset], make([]byte, c.offset)) {
				t.Errorf("%s: vnet_hdr of a plain ARP frame is % x, want zeros", c.name, b[:c.offset])
			}
		}
		if !found {
			t.Errorf("%s: no broadcast ARP frame at offset %d", c.name, c.offset)
		}
	}
	if _, err := netns.OpenTapWith("", "tapx", netns.TapOptions{Offloads: netns.TunTSO4}); err == nil || !strings.Contains(err.Error(), "tapx") {
		t.Errorf("offloads without a vnet_hdr: err %v, want one naming tapx", err)
	}
}
