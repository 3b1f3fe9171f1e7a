package vnatd

import (
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/netns/netnstest"
	"github.com/onehop/onehop/internal/testenv"
)

// Keys agreed before a daemon restart still authenticate a move after it,
// with the real daemons (both requiring keys, the default; b pinned). a and b key
// their connection at first contact; b's daemon keeps the keys in its key
// file (mode 0600, nothing of them in its log) and ends on SIGTERM; the
// new daemon takes the connection over keyed, and b's move after the
// restart is accepted by a: migrated at both ends, echoing. b's daemon is
// restarted again and a moves: the sequence numbers and the replay window
// the first move used were kept too, so that move is accepted as well.
// `vnat stop` removes the key file. The control removes the key file
// before the first restart: the new daemon is unkeyed, a refuses its
// unauthenticated update and the connection is not migrated.
func TestPrivilegedKeysSurviveADaemonRestart(t *testing.T) {
	for _, keep := range []bool{true, false} {
		name := map[bool]string{true: "key file kept: moves after restarts", false: "key file removed: the move is refused"}[keep]
		t.Run(name, func(t *testing.T) { keysAcrossRestart(t, keep) })
	}
}

func keysAcrossRestart(t *testing.T, keep bool) {
	pinDir := filepath.Join(netnstest.BPFFS(t), "vnat-b")
	keyFile := KeyFile{Path: KeyFilePath(pinDir), PinDir: pinDir}
	t.Cleanup(func() {
		if err := keyFile.Remove(); err != nil {
			t.Error(err)
		}
	})
	p := newPair(t, nil, []string{"--pin-dir", pinDir})
	c, echo := p.keyedEcho(t)
	aV := c.LocalAddr().String()
	virtA, virtB := p.virtual(c)
	logs := []*testenv.Buffer{p.a.logs, p.b.logs}

	// b's key file: 0600, the connection's keys, none of them in the log.
	es := waitKeyFile(t, keyFile, 5*time.Second, func(es []KeyEntry) bool { return len(es) == 1 })
	if es[0].Conn.String() != "tcp "+virtB {
		t.Fatalf("key file holds %v, want tcp %s", es[0], virtB)
	}
	fi, err := os.Stat(keyFile.Path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file %s: %v, %v; want mode 0600", keyFile.Path, fi.Mode(), err)
	}

	restartB := func() {
		t.Helper()
		p.b.term(t)
		if _, err := os.Stat(keyFile.Path); keep && err != nil {
			t.Fatalf("key file after SIGTERM: %v, want it kept", err)
		}
		p.start(t, p.b)
	}
	if !keep {
		if err := os.Remove(keyFile.Path); err != nil {
			t.Fatal(err)
		}
	}
	restartB()
	if keep {
		waitStatus(t, p.b.sock, virtB, 5*time.Second, func(c ConnStatus) bool { return c.Keyed && c.State == "active" }, logs...)
	}

	// b moves.
	p.moveB(t)
	if !keep {
		// a refuses b's unauthenticated update; b gives the migration up.
		waitStatus(t, p.b.sock, virtB, 20*time.Second, func(c ConnStatus) bool { return c.State == "aborted" }, logs...)
		st, err := Ask(p.a.sock, Request{Op: "status"})
		if err != nil {
			t.Fatal(err)
		}
		if st.Counters["refused_unkeyed"] == 0 {
			t.Errorf("a's counters %v: want b's unkeyed update refused", st.Counters)
		}
		for _, s := range st.Conns {
			if s.Virtual == virtA && s.State == "migrated" {
				t.Errorf("a migrated the connection on an unauthenticated update: %+v", s)
			}
		}
		return
	}
	physB := "10.8.1.3:5001->" + aV
	waitStatus(t, p.b.sock, virtB, 15*time.Second, func(c ConnStatus) bool { return c.State == "migrated" && c.Physical == physB }, logs...)
	waitStatus(t, p.a.sock, virtA, 10*time.Second, func(c ConnStatus) bool { return c.State == "migrated" }, logs...)
	for range 5 {
		if err := echo("b moved after a restart"); err != nil {
			t.Fatalf("after b's move: %v\n%s\n---\n%s", err, p.a.logs, p.b.logs)
		}
	}
	waitKeyFile(t, keyFile, 5*time.Second, func(es []KeyEntry) bool { return len(es) == 1 && es[0].SendSeq == 1 && es[0].RecvTop == 1 })

	// Again, and a moves: b opens a's update with the kept window and
	// seals its reply with the next sequence number.
	restartB()
	waitStatus(t, p.b.sock, virtB, 5*time.Second, func(c ConnStatus) bool { return c.Keyed && c.State == "migrated" }, logs...)
	netnstest.IP(t, p.nsA, "addr", "del", "10.8.0.1/24", "dev", "a0")
	netnstest.IP(t, p.nsA, "addr", "add", "10.8.2.5/24", "dev", "a0")
	netnstest.IP(t, p.nsA, "route", "add", "10.8.1.0/24", "dev", "a0")
	netnstest.IP(t, p.nsB, "route", "add", "10.8.2.0/24", "dev", "b0")
	netnstest.IP(t, p.nsB, "neigh", "flush", "dev", "b0")
	aP := aV[strings.LastIndexByte(aV, ':')+1:]
	waitStatus(t, p.b.sock, virtB, 15*time.Second, func(c ConnStatus) bool {
		return c.State == "migrated" && c.Physical == "10.8.1.3:5001->10.8.2.5:"+aP
	}, logs...)
	waitStatus(t, p.a.sock, virtA, 10*time.Second, func(c ConnStatus) bool {
		return c.State == "migrated" && c.Physical == "10.8.2.5:"+aP+"->10.8.1.3:5001"
	}, logs...)
	for range 5 {
		if err := echo("a moved after b's second restart"); err != nil {
			t.Fatalf("after a's move: %v\n%s\n---\n%s", err, p.a.logs, p.b.logs)
		}
	}
	st, err := Ask(p.a.sock, Request{Op: "status"})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []string{"refused_replayed", "refused_forged", "refused_unkeyed", "refused_rekey"} {
		if st.Counters[r] != 0 {
			t.Errorf("a's counters %v: want nothing of b's refused", st.Counters)
			break
		}
	}

	// None of the keys ever reached a log.
	es = waitKeyFile(t, keyFile, 5*time.Second, func(es []KeyEntry) bool { return len(es) == 1 })
	all := p.a.logs.String() + p.b.logs.String()
	for _, s := range [][]byte{es[0].Keys.Send[:], es[0].Keys.Recv[:]} {
		for _, enc := range []string{hex.EncodeToString(s), base64.StdEncoding.EncodeToString(s)[:20], fmt.Sprint(s[:6])} {
			if strings.Contains(all, enc) {
				t.Fatalf("a key shows in the daemons' logs (%s)", enc)
			}
		}
	}

	// Stopped on request: the key file goes with the pins.
	if _, err := Ask(p.b.sock, Request{Op: "stop"}); err != nil {
		t.Fatal(err)
	}
	p.b.wait(t, 10*time.Second)
	if _, err := os.Stat(keyFile.Path); !os.IsNotExist(err) {
		t.Errorf("key file %s after vnat stop: %v, want it gone", keyFile.Path, err)
	}
}

// waitKeyFile reads the key file until cond holds for its entries.
func waitKeyFile(t *testing.T, f KeyFile, timeout time.Duration, cond func([]KeyEntry) bool) []KeyEntry {
	t.Helper()
	var es []KeyEntry
	testenv.Eventually(t, "key file "+f.Path+" as the test waits for it", timeout, func() error {
		var err error
		if es, err = f.Load(); err == nil && !cond(es) {
			err = fmt.Errorf("entries %v", es)
		}
		return err
	})
	return es
}
