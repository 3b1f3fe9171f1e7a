package vnatd

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/onehop/onehop/internal/netns"
	"github.com/onehop/onehop/internal/netns/netnstest"
)

// A migrated connection outlives its daemon: b's daemon ends on SIGTERM
// and the connection still echoes (the pinned programs and maps translate
// it); a new daemon takes it over (status migrated, same physical tuple)
// and it echoes; `vnat stop` removes the pins and the translation (the
// connection no longer gets through, and b0's hooks are empty). The
// control runs b unpinned: when its daemon ends, the connection stalls.
func TestPrivilegedTranslationsSurviveADaemonRestart(t *testing.T) {
	for _, pinned := range []bool{false, true} {
		t.Run(map[bool]string{false: "unpinned: the translation ends with the daemon", true: "pinned: it survives a restart"}[pinned], func(t *testing.T) {
			restartDaemon(t, pinned)
		})
	}
}

func restartDaemon(t *testing.T, pinned bool) {
	var argsB []string
	pinDir := ""
	if pinned {
		pinDir = filepath.Join(netnstest.BPFFS(t), "vnat-b")
		argsB = []string{"--pin-dir", pinDir}
	} else {
		argsB = []string{"--no-pin"}
	}
	p := newPair(t, nil, argsB)
	c, echo := p.keyedEcho(t)
	aV := c.LocalAddr().String()
	virtA, virtB := p.virtual(c)

	// b moves; both daemons translate.
	p.moveB(t)
	physB := "10.8.1.3:5001->" + aV
	waitStatus(t, p.b.sock, virtB, 10*time.Second, func(c ConnStatus) bool { return c.State == "migrated" && c.Physical == physB }, p.a.logs, p.b.logs)
	waitStatus(t, p.a.sock, virtA, 10*time.Second, func(c ConnStatus) bool { return c.State == "migrated" }, p.a.logs, p.b.logs)
	if err := echo("after the move"); err != nil {
		t.Fatal(err)
	}

	// b's daemon ends on a signal.
	p.b.term(t)
	if !pinned {
		if err := echo("daemon gone, unpinned"); err == nil {
			t.Fatalf("the connection still echoes with b's unpinned daemon gone: the control proves nothing\n%s", p.b.logs)
		}
		return
	}
	for range 5 {
		if err := echo("daemon gone"); err != nil {
			t.Fatalf("with b's daemon gone: %v\n%s", err, p.b.logs)
		}
	}
	p.start(t, p.b)
	waitStatus(t, p.b.sock, virtB, 10*time.Second, func(c ConnStatus) bool { return c.State == "migrated" && c.Physical == physB }, p.a.logs, p.b.logs)
	for range 5 {
		if err := echo("daemon back"); err != nil {
			t.Fatalf("with b's daemon back: %v\n%s", err, p.b.logs)
		}
	}

	// Stopped on request: everything goes.
	if _, err := Ask(p.b.sock, Request{Op: "stop"}); err != nil {
		t.Fatal(err)
	}
	p.b.wait(t, 10*time.Second)
	if _, err := os.Stat(pinDir); !os.IsNotExist(err) {
		t.Errorf("pin dir %s after vnat stop: %v, want it gone", pinDir, err)
	}
	for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
		err := netns.Do(p.nsB, func() error {
			l, err := netlink.LinkByName("b0")
			if err != nil {
				return err
			}
			res, err := link.QueryPrograms(link.QueryOptions{Target: l.Attrs().Index, Attach: at})
			if err != nil {
				return err
			}
			if len(res.Programs) != 0 {
				return fmt.Errorf("%d programs on b0's %s after vnat stop", len(res.Programs), at)
			}
			return nil
		})
		if err != nil {
			t.Error(err)
		}
	}
	if err := echo("stopped"); err == nil {
		t.Error("the connection still echoes after vnat stop removed b's translation")
	}
}
