package vnatd

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/testenv"
	"github.com/onehop/onehop/internal/vcmp"
)

// testEntries are two entries with every field set and distinct.
func testEntries() []KeyEntry {
	es := []KeyEntry{
		{Conn: vcmp.Tuple{Proto: vcmp.TCP, Local: netip.MustParseAddrPort("10.0.1.1:40000"), Remote: netip.MustParseAddrPort("10.0.2.2:22")},
			SendSeq: 7, RecvTop: 70, RecvSeen: 0x8000_0000_0000_0005},
		{Conn: vcmp.Tuple{Proto: vcmp.UDP, Local: netip.MustParseAddrPort("10.0.1.1:5353"), Remote: netip.MustParseAddrPort("10.0.3.3:53")},
			SendSeq: 1, RecvTop: 0, RecvSeen: 0},
	}
	for i := range es {
		for j := range vcmp.KeyLen {
			es[i].Keys.Send[j] = byte(1 + i + j)
			es[i].Keys.Recv[j] = byte(2 + i + 3*j)
			es[i].Own[j] = byte(3 + i + 5*j)
			es[i].Peer[j] = byte(4 + i + 7*j)
		}
	}
	return es
}

func keyFileIn(t *testing.T) KeyFile {
	t.Helper()
	return KeyFile{Path: filepath.Join(t.TempDir(), "keys", "x.keys"), PinDir: "/sys/fs/bpf/test/vnat"}
}

func TestKeyFileRoundTrip(t *testing.T) {
	f := keyFileIn(t)
	es := testEntries()
	if err := f.Save(es); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(f.Path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("key file mode %#o, want 0600", fi.Mode().Perm())
	}
	if d, err := os.Stat(filepath.Dir(f.Path)); err != nil || d.Mode().Perm() != 0o700 {
		t.Errorf("key dir: %v, %v; want mode 0700", d.Mode(), err)
	}
	got, err := f.Load()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, es) {
		t.Fatalf("loaded\n%#v\nwant\n%#v", got, es)
	}
	// Saved again: replaced whole, no temporary file left.
	if err := f.Save(es[:1]); err != nil {
		t.Fatal(err)
	}
	if got, err := f.Load(); err != nil || !reflect.DeepEqual(got, es[:1]) {
		t.Fatalf("after a second save: %v, %v", got, err)
	}
	ents, err := os.ReadDir(filepath.Dir(f.Path))
	if err != nil || len(ents) != 1 {
		t.Errorf("key dir holds %v (%v), want the key file alone", ents, err)
	}
	// No entries: no file; none is no entries.
	if err := f.Save(nil); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(f.Path); !os.IsNotExist(err) {
		t.Errorf("key file after saving no entries: %v, want it gone", err)
	}
	if got, err := f.Load(); err != nil || got != nil {
		t.Errorf("no key file: %v, %v; want nothing", got, err)
	}
}

// A key file that is not exactly what this daemon wrote is refused, the
// error naming the file and what is wrong with it.
func TestKeyFileRefusesWhatItCannotTrust(t *testing.T) {
	good, err := EncodeKeyFile("/sys/fs/bpf/test/vnat", testEntries())
	if err != nil {
		t.Fatal(err)
	}
	with := func(f func([]byte) []byte) []byte { return f(bytes.Clone(good)) }
	for _, tc := range []struct {
		name  string
		bytes []byte
		mode  os.FileMode
		want  string
	}{
		{"empty", []byte{}, 0o600, "truncated"},
		{"truncated in the header", good[:11], 0o600, "truncated"},
		{"truncated in an entry", good[:len(good)-sha256Len-10], 0o600, "truncated"},
		{"checksum cut off", good[:len(good)-1], 0o600, "truncated"},
		{"a byte too many", append(bytes.Clone(good), 0), 0o600, "1 bytes after the end"},
		{"wrong magic", with(func(b []byte) []byte { b[0] = 'X'; return b }), 0o600, "not a vnat key file"},
		{"wrong version", with(func(b []byte) []byte { binary.BigEndian.PutUint16(b[8:], 2); return b }), 0o600, "version 2; this daemon reads version 1"},
		{"a key flipped", with(func(b []byte) []byte { b[len(b)-sha256Len-100] ^= 1; return b }), 0o600, "checksum does not match"},
		{"wrong mode", good, 0o644, "mode 0644, want 0600"},
		{"group readable", good, 0o640, "mode 0640, want 0600"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := keyFileIn(t)
			if err := os.MkdirAll(filepath.Dir(f.Path), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(f.Path, tc.bytes, tc.mode); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(f.Path, tc.mode); err != nil { // past the umask
				t.Fatal(err)
			}
			es, err := f.Load()
			if err == nil || !strings.Contains(err.Error(), f.Path) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "not trusted") {
				t.Fatalf("Load: %v, %v; want an error naming %s, saying %q, not trusted", es, err, f.Path, tc.want)
			}
		})
	}
	t.Run("another pin dir's", func(t *testing.T) {
		f := keyFileIn(t)
		if err := f.Save(testEntries()); err != nil {
			t.Fatal(err)
		}
		f.PinDir = "/sys/fs/bpf/other"
		if _, err := f.Load(); err == nil || !strings.Contains(err.Error(), `written for pin dir "/sys/fs/bpf/test/vnat"`) {
			t.Fatalf("Load with another pin dir: %v", err)
		}
	})
	t.Run("a symlink", func(t *testing.T) {
		f := keyFileIn(t)
		real := KeyFile{Path: f.Path + ".real", PinDir: f.PinDir}
		if err := real.Save(testEntries()); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(real.Path, f.Path); err != nil {
			t.Fatal(err)
		}
		if _, err := f.Load(); err == nil || !strings.Contains(err.Error(), f.Path) {
			t.Fatalf("Load through a symlink: %v, want refused", err)
		}
	})
	t.Run("owned by another user", func(t *testing.T) {
		testenv.RequireRoot(t, "chown to another user")
		f := keyFileIn(t)
		if err := f.Save(testEntries()); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(f.Path, 4242, 4242); err != nil {
			t.Fatal(err)
		}
		if _, err := f.Load(); err == nil || !strings.Contains(err.Error(), f.Path) || !strings.Contains(err.Error(), "owned by uid 4242") {
			t.Fatalf("Load of another user's file: %v", err)
		}
	})
}

// sha256Len is the checksum's size at a key file's end.
const sha256Len = 32

// The window a key file keeps is the window: every number it refused
// before it refuses after, and every other number it accepted it accepts.
func TestReplayWindowSurvivesTheKeyFile(t *testing.T) {
	for _, seqs := range [][]uint64{nil, {1}, {1, 2, 3}, {5, 3, 9}, {1, 70, 68, 100, 99, 37}, {200}} {
		var w vcmp.Window
		for _, s := range seqs {
			w.Accept(s)
		}
		top, seen := windowState(&w)
		r := restoreWindow(top, seen)
		for s := uint64(0); s < 260; s++ {
			if (w.Check(s) == nil) != (r.Check(s) == nil) {
				t.Errorf("after %v: seq %d: %v before the file, %v after", seqs, s, w.Check(s), r.Check(s))
			}
		}
	}
}

// The keys never reach a log line or a %v.
func TestKeyEntryIsNeverLogged(t *testing.T) {
	e := testEntries()[0]
	var buf bytes.Buffer
	slog.New(slog.NewTextHandler(&buf, nil)).Info("x", "entry", e)
	out := buf.String() + fmt.Sprintf("%v %+v %#v %s", e, e, e, e)
	for _, secret := range [][]byte{e.Keys.Send[:], e.Keys.Recv[:]} {
		if strings.Contains(out, hex.EncodeToString(secret[:8])) || strings.Contains(out, fmt.Sprint(secret[:4])) || strings.Contains(out, fmt.Sprintf("%d, %d, %d", secret[0], secret[1], secret[2])) {
			t.Fatalf("a key shows in %q", out)
		}
	}
	if !strings.Contains(out, e.Conn.String()) {
		t.Errorf("the connection does not show in %q", out)
	}
}

// A daemon restart between the key agreement and the moves, on the fake
// network: b's engine is replaced by a new one over the same datapath,
// which loads the key file the old one kept. With keys required at both
// ends (the default), a's move after the restart, and b's after a second restart (the
// sequence numbers and windows used by the first move kept too), are
// authenticated and succeed; a connection that closed while no daemon
// ran is dropped from the file. Without the key file the move is refused.
func TestKeysSurviveADaemonRestart(t *testing.T) {
	for _, keep := range []bool{false, true} {
		t.Run(fmt.Sprintf("keep=%v", keep), func(t *testing.T) {
			n := newNetwork()
			kf := keyFileIn(t)
			cfg := Config{}
			if keep {
				cfg.Keys = kf
			}
			a := n.add(t, "a", "10.0.1.1", Config{})
			b := n.add(t, "b", "10.0.2.2", cfg)
			ta, tb := connect(a, b, 40000)
			tc, _ := connect(a, b, 40001)
			syncAll(t, a, b)
			if _, err := a.e.AgreeKeys(t.Context()); err != nil {
				t.Fatal(err)
			}
			if !state(t, b, tb).Keyed {
				t.Fatal("b not keyed")
			}
			restart := func() {
				t.Helper()
				c := cfg
				b.logs = &bytes.Buffer{}
				c.Logger = slog.New(slog.NewTextHandler(b.logs, nil))
				b.e = New(c, b.tr, func(ctx context.Context, to netip.Addr) (io.ReadWriteCloser, error) {
					return n.dial(ctx, b, to)
				})
				syncAll(t, b)
				if keep {
					es, err := kf.Load()
					if err != nil {
						t.Fatal(err)
					}
					b.e.LoadKeys(es)
				}
			}
			bOwn, aOwn := b.e.conns[tb].own, a.e.conns[ta].own
			restart()
			if s := state(t, b, tb); s.Keyed != keep {
				t.Fatalf("b after the restart: %+v, want keyed=%v", s, keep)
			}
			if keep {
				// a sends its key again (a first contact crossing the
				// restart): the same agreement, answered with b's same key.
				ans := sendOne(t, n, a, b.addr, &vcmp.Key{Record: vcmp.Record{Conn: ta, Phys: ta.Local}, Public: aOwn})
				if k, ok := ans.(*vcmp.Key); !ok || k.Public != bOwn {
					t.Fatalf("b answered a's key again with %v, want its own key from before the restart", ans)
				}
			}
			old, new := n.move(a, "10.0.3.3")
			err := a.e.Restore(t.Context(), old, new)
			if !keep {
				if s := state(t, a, ta); s.State == "migrated" {
					t.Fatalf("a migrated with b's keys lost: the control proves nothing")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			wantPhys(t, a, ta, new, b.addr)
			wantPhys(t, b, tb, b.addr, new)

			// A second restart after the first move's sealed exchange, one
			// connection closed meanwhile: b moves, sealing with the next
			// sequence number and opening a's reply with its window.
			b.tr.close(tc.Reverse())
			a.tr.close(tc)
			restart()
			es, err := kf.Load()
			if err != nil || len(es) != 1 || es[0].Conn != tb {
				t.Fatalf("key file after the second restart: %v, %v; want %v's entry alone", es, err, tb)
			}
			if es[0].SendSeq != 1 || es[0].RecvTop != 1 {
				t.Errorf("b's entry after one move: send seq %d, window top %d; want 1 and 1", es[0].SendSeq, es[0].RecvTop)
			}
			old, new = n.move(b, "10.0.4.4")
			if err := b.e.Restore(t.Context(), old, new); err != nil {
				t.Fatal(err)
			}
			wantPhys(t, b, tb, new, a.addr)
			if c := a.e.Counters(); c["refused_replayed"]+c["refused_forged"]+c["refused_unkeyed"] != 0 {
				t.Errorf("a refused b's updates: %v", c)
			}
			// Closed: its keys leave the file (the last one: the file goes).
			b.tr.close(tb)
			syncAll(t, b)
			if _, err := os.Stat(kf.Path); !os.IsNotExist(err) {
				t.Errorf("key file with no connection left: %v, want it gone", err)
			}
		})
	}
}

// BenchmarkKeyFileSave300 is one save of 300 keyed connections (what a
// restore of 300 connections with one peer writes twice on the mover and
// once on the peer).
func BenchmarkKeyFileSave300(b *testing.B) {
	f := KeyFile{Path: filepath.Join(b.TempDir(), "keys", "x.keys"), PinDir: "/sys/fs/bpf/test/vnat"}
	one := testEntries()[0]
	es := make([]KeyEntry, 300)
	for i := range es {
		es[i] = one
		es[i].Conn.Local = netip.AddrPortFrom(one.Conn.Local.Addr(), uint16(10000+i))
	}
	for b.Loop() {
		if err := f.Save(es); err != nil {
			b.Fatal(err)
		}
	}
}
