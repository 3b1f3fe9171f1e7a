package vnatd

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/onehop/onehop/internal/vcmp"
)

// The agreed update keys outlive a daemon restart (`onehop vnat run` ended
// by a signal, run again on the same pin directory): a connection whose
// translation the pinned maps keep, or whose socket is simply still open,
// is taken over by the next daemon, and its peer refuses new keys outside
// a suspension, so without the old keys it could never again move (keys
// are required unless `--allow-unkeyed`). The keys are kept in a key file
// beside the pinned state, rewritten whenever they change (agreed, a sequence
// number used, the replay window moved, the connection closed), read at
// start, and removed by `onehop vnat stop`.

// KeyEntry is one connection's agreed keys as the key file keeps them:
// what sealing and opening its updates needs, and nothing of the X25519
// private key (a new agreement makes a new one). It is secret: it is never
// logged (LogValue and Format show the connection alone).
type KeyEntry struct {
	// Conn is the connection's virtual tuple, seen from this end.
	Conn vcmp.Tuple
	// Keys are its update keys.
	Keys vcmp.Keys
	// Own and Peer are the public keys of the agreement: a peer sending
	// its key again is answered with Own, and the same key agrees nothing new.
	Own, Peer [vcmp.KeyLen]byte
	// SendSeq is the last sequence number this end sealed with.
	SendSeq uint64
	// RecvTop and RecvSeen are the replay window of what the peer sealed:
	// the highest sequence number accepted, and bit i set when RecvTop-i was.
	RecvTop, RecvSeen uint64
}

// LogValue keeps the keys out of every log line.
func (k KeyEntry) LogValue() slog.Value {
	return slog.GroupValue(slog.String("conn", k.Conn.String()), slog.String("keys", "redacted"))
}

// Format keeps the keys out of every %v.
func (k KeyEntry) Format(f fmt.State, _ rune) {
	fmt.Fprintf(f, "{%s keys redacted}", k.Conn)
}

// KeyStore keeps the connections' keys across a daemon restart. Save is
// given every keyed connection, each time they change (with the engine's
// lock held: it must be quick).
type KeyStore interface {
	Save([]KeyEntry) error
}

// KeyDir holds the daemons' key files: not on the bpffs (it holds no
// regular files), in /run like the control sockets, so both go at reboot
// as the pins do.
const KeyDir = ControlDir + "/keys"

// KeyFilePath is the key file of the daemon pinning under pinDir: one file
// per pin directory, named by a hash of its path.
func KeyFilePath(pinDir string) string {
	h := sha256.Sum256([]byte(filepath.Clean(pinDir)))
	return filepath.Join(KeyDir, hex.EncodeToString(h[:8])+".keys")
}

// KeyFile is the KeyStore on disk: a file of mode 0600, owned by the
// daemon's user, written atomically (a temporary file renamed over it),
// bound to the pin directory it was written for.
type KeyFile struct {
	Path   string
	PinDir string
}

// keyFileMagic starts every key file; keyFileVersion is the layout below.
const (
	keyFileMagic   = "OHVNATKS"
	keyFileVersion = 1
	// keyEntryLen: protocol, local and remote address and port, the two
	// keys, the two public keys, the send sequence, the window.
	keyEntryLen = 1 + 6 + 6 + 2*vcmp.SecretLen + 2*vcmp.KeyLen + 3*8
	// maxKeyEntries bounds what a key file may claim to hold.
	maxKeyEntries = 1 << 20
)

// EncodeKeyFile is a key file's bytes (version 1, big-endian):
//
//	magic "OHVNATKS" | version u16 | pin dir length u16 | pin dir
//	| count u32 | count entries | SHA-256 of everything before
//
// an entry being protocol u8, local IPv4 and port, remote IPv4 and port,
// send key, receive key, own and peer public keys, send sequence u64,
// window top u64, window bitmap u64.
func EncodeKeyFile(pinDir string, es []KeyEntry) ([]byte, error) {
	if len(pinDir) > 0xffff {
		return nil, fmt.Errorf("pin dir of %d bytes: too long for a key file", len(pinDir))
	}
	b := make([]byte, 0, len(keyFileMagic)+8+len(pinDir)+len(es)*keyEntryLen+sha256.Size)
	b = append(b, keyFileMagic...)
	b = binary.BigEndian.AppendUint16(b, keyFileVersion)
	b = binary.BigEndian.AppendUint16(b, uint16(len(pinDir)))
	b = append(b, pinDir...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(es)))
	for _, e := range es {
		t := e.Conn
		if !t.Local.Addr().Is4() || !t.Remote.Addr().Is4() || (t.Proto != vcmp.TCP && t.Proto != vcmp.UDP) {
			return nil, fmt.Errorf("key entry %s: not an IPv4 tcp/udp connection", t)
		}
		l, r := t.Local.Addr().As4(), t.Remote.Addr().As4()
		b = append(b, byte(t.Proto))
		b = append(b, l[:]...)
		b = binary.BigEndian.AppendUint16(b, t.Local.Port())
		b = append(b, r[:]...)
		b = binary.BigEndian.AppendUint16(b, t.Remote.Port())
		b = append(b, e.Keys.Send[:]...)
		b = append(b, e.Keys.Recv[:]...)
		b = append(b, e.Own[:]...)
		b = append(b, e.Peer[:]...)
		b = binary.BigEndian.AppendUint64(b, e.SendSeq)
		b = binary.BigEndian.AppendUint64(b, e.RecvTop)
		b = binary.BigEndian.AppendUint64(b, e.RecvSeen)
	}
	sum := sha256.Sum256(b)
	return append(b, sum[:]...), nil
}

// DecodeKeyFile reads a key file's bytes: the pin directory it was written
// for and its entries. Anything short, long, of another version or whose
// checksum does not match is refused, saying which.
func DecodeKeyFile(b []byte) (string, []KeyEntry, error) {
	head := len(keyFileMagic) + 4
	if len(b) < len(keyFileMagic) {
		return "", nil, fmt.Errorf("truncated: %d bytes, shorter than the header", len(b))
	}
	if string(b[:len(keyFileMagic)]) != keyFileMagic {
		return "", nil, fmt.Errorf("not a vnat key file (starts %q, want %q)", b[:len(keyFileMagic)], keyFileMagic)
	}
	if len(b) < head {
		return "", nil, fmt.Errorf("truncated: %d bytes, shorter than the header", len(b))
	}
	if v := binary.BigEndian.Uint16(b[len(keyFileMagic):]); v != keyFileVersion {
		return "", nil, fmt.Errorf("version %d; this daemon reads version %d", v, keyFileVersion)
	}
	pl := int(binary.BigEndian.Uint16(b[len(keyFileMagic)+2:]))
	if len(b) < head+pl+4 {
		return "", nil, fmt.Errorf("truncated: %d bytes, shorter than the header", len(b))
	}
	pinDir := string(b[head : head+pl])
	n := binary.BigEndian.Uint32(b[head+pl:])
	if n > maxKeyEntries {
		return "", nil, fmt.Errorf("claims %d entries, more than %d", n, maxKeyEntries)
	}
	body := head + pl + 4
	want := body + int(n)*keyEntryLen + sha256.Size
	switch {
	case len(b) < want:
		return "", nil, fmt.Errorf("truncated: %d bytes, want %d for %d entries", len(b), want, n)
	case len(b) > want:
		return "", nil, fmt.Errorf("%d bytes after the end of %d entries", len(b)-want, n)
	}
	if sum := sha256.Sum256(b[:want-sha256.Size]); !bytes.Equal(sum[:], b[want-sha256.Size:]) {
		return "", nil, errors.New("checksum does not match: corrupt")
	}
	es := make([]KeyEntry, n)
	seen := make(map[vcmp.Tuple]bool, n)
	for i := range es {
		p := b[body+i*keyEntryLen:]
		e := &es[i]
		e.Conn.Proto = vcmp.Proto(p[0])
		if e.Conn.Proto != vcmp.TCP && e.Conn.Proto != vcmp.UDP {
			return "", nil, fmt.Errorf("entry %d: protocol %d is not tcp or udp", i, p[0])
		}
		e.Conn.Local = netip.AddrPortFrom(netip.AddrFrom4([4]byte(p[1:5])), binary.BigEndian.Uint16(p[5:]))
		e.Conn.Remote = netip.AddrPortFrom(netip.AddrFrom4([4]byte(p[7:11])), binary.BigEndian.Uint16(p[11:]))
		p = p[13:]
		p = p[copy(e.Keys.Send[:], p):]
		p = p[copy(e.Keys.Recv[:], p):]
		p = p[copy(e.Own[:], p):]
		p = p[copy(e.Peer[:], p):]
		e.SendSeq = binary.BigEndian.Uint64(p)
		e.RecvTop = binary.BigEndian.Uint64(p[8:])
		e.RecvSeen = binary.BigEndian.Uint64(p[16:])
		if seen[e.Conn] {
			return "", nil, fmt.Errorf("entry %d: %s twice", i, e.Conn)
		}
		seen[e.Conn] = true
	}
	return pinDir, es, nil
}

// maxKeyFile bounds what Load reads.
const maxKeyFile = 64 << 20

// Load reads the key file; none is no entries. A file that is not a
// regular file of mode 0600 owned by this process's user, that does not
// decode, or that was written for another pin directory is refused with an
// error naming it: its keys are not trusted.
func (f KeyFile) Load() ([]KeyEntry, error) {
	fd, err := os.OpenFile(f.Path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("vnat key file %s: %w (not trusted; remove it to start without the keys kept before the restart)", f.Path, err)
	}
	defer fd.Close()
	refuse := func(format string, args ...any) error {
		return fmt.Errorf("vnat key file %s: %s: not trusted (remove it to start without the keys kept before the restart)", f.Path, fmt.Sprintf(format, args...))
	}
	fi, err := fd.Stat()
	if err != nil {
		return nil, refuse("%v", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, refuse("not a regular file (%s)", fi.Mode().Type())
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != os.Geteuid() {
		uid := -1
		if ok {
			uid = int(st.Uid)
		}
		return nil, refuse("owned by uid %d, not this daemon's (uid %d)", uid, os.Geteuid())
	}
	if m := fi.Mode().Perm(); m != 0o600 {
		return nil, refuse("mode %#o, want 0600", m)
	}
	b, err := io.ReadAll(io.LimitReader(fd, maxKeyFile+1))
	if err != nil {
		return nil, refuse("%v", err)
	}
	if len(b) > maxKeyFile {
		return nil, refuse("larger than %d bytes", maxKeyFile)
	}
	pin, es, err := DecodeKeyFile(b)
	if err != nil {
		return nil, refuse("%v", err)
	}
	if filepath.Clean(pin) != filepath.Clean(f.PinDir) {
		return nil, refuse("written for pin dir %q, this daemon pins under %q", pin, f.PinDir)
	}
	return es, nil
}

// Save replaces the key file with es atomically (written to a temporary
// file of mode 0600 in the same directory, synced, renamed over it); no
// entries removes it.
func (f KeyFile) Save(es []KeyEntry) error {
	if len(es) == 0 {
		return f.Remove()
	}
	b, err := EncodeKeyFile(f.PinDir, es)
	if err != nil {
		return fmt.Errorf("vnat key file %s: %w", f.Path, err)
	}
	dir := filepath.Dir(f.Path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("vnat key file %s: %w", f.Path, err)
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(f.Path)+".*")
	if err != nil {
		return fmt.Errorf("vnat key file %s: %w", f.Path, err)
	}
	ok := false
	defer func() {
		if !ok {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err := tmp.Chmod(0o600); err != nil {
		return fmt.Errorf("vnat key file %s: %w", f.Path, err)
	}
	if _, err := tmp.Write(b); err != nil {
		return fmt.Errorf("vnat key file %s: %w", f.Path, err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("vnat key file %s: %w", f.Path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("vnat key file %s: %w", f.Path, err)
	}
	if err := os.Rename(tmp.Name(), f.Path); err != nil {
		return fmt.Errorf("vnat key file %s: %w", f.Path, err)
	}
	ok = true
	return nil
}

// Remove removes the key file (none there is fine).
func (f KeyFile) Remove() error {
	if err := os.Remove(f.Path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("vnat key file %s: %w", f.Path, err)
	}
	return nil
}

// windowState reads a replay window back: its top and which of the
// WindowSize numbers up to it were accepted (Check refuses them).
func windowState(w *vcmp.Window) (top, seen uint64) {
	top = w.Top()
	for i := uint64(0); i < vcmp.WindowSize && i < top; i++ {
		if w.Check(top-i) != nil {
			seen |= 1 << i
		}
	}
	return top, seen
}

// restoreWindow is the window windowState read: the accepted numbers
// accepted again, oldest first.
func restoreWindow(top, seen uint64) vcmp.Window {
	var w vcmp.Window
	for i := uint64(vcmp.WindowSize); i > 0; i-- {
		if j := i - 1; j < top && seen&(1<<j) != 0 {
			w.Accept(top - j)
		}
	}
	if top > 0 && w.Top() != top {
		w.Accept(top)
	}
	return w
}

// keyEntries are the keyed connections' entries, sorted by connection
// (so one state is one file). Called with e.mu held.
func (e *Engine) keyEntries() []KeyEntry {
	var es []KeyEntry
	for t, c := range e.conns {
		if c.keys == nil || c.peerPub == nil {
			continue
		}
		top, seen := windowState(&c.win)
		es = append(es, KeyEntry{Conn: t, Keys: *c.keys, Own: c.own, Peer: *c.peerPub,
			SendSeq: c.sendSeq, RecvTop: top, RecvSeen: seen})
	}
	slices.SortFunc(es, func(a, b KeyEntry) int { return strings.Compare(a.Conn.String(), b.Conn.String()) })
	return es
}

// saveKeys writes the keys when they changed. A write that fails is
// logged (rate-limited) and tried again at the next change or Sync.
// Called with e.mu held.
func (e *Engine) saveKeys() {
	if !e.keysDirty || e.keys == nil {
		return
	}
	if err := e.keys.Save(e.keyEntries()); err != nil {
		e.warn("key_file_errors", "vnat: save the agreed keys (a restart now loses them)", "err", err)
		return
	}
	e.keysDirty = false
}

// LoadKeys gives the connections the keys a daemon before this one
// agreed (its key file): call it after the first Sync, before anything
// talks VCMP. An entry whose connection this end does not have (it
// closed while no daemon ran) is dropped, and the store rewritten
// without it. It returns how many connections got their keys back and
// how many entries were dropped.
func (e *Engine) LoadKeys(es []KeyEntry) (loaded, dropped int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, en := range es {
		c, ok := e.conns[en.Conn]
		if !ok || c.m.State == vcmp.Aborted {
			dropped++
			continue
		}
		keys, peer := en.Keys, en.Peer
		c.priv, c.own, c.keys, c.peerPub = nil, en.Own, &keys, &peer
		c.sendSeq, c.win = en.SendSeq, restoreWindow(en.RecvTop, en.RecvSeen)
		loaded++
	}
	if dropped > 0 {
		e.keysDirty = true
	}
	e.saveKeys()
	return loaded, dropped
}

// DropKeys stops keeping the keys and removes what was kept (`onehop vnat
// stop`: nothing is taken over after it).
func (e *Engine) DropKeys() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	ks := e.keys
	e.keys = nil
	if ks == nil {
		return nil
	}
	return ks.Save(nil)
}
