package ctlsock

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Mode is the mode of every control socket: connecting to a unix socket
// needs write permission on it, so only its owner (root) may ask.
const Mode fs.FileMode = 0o600

// NetnsInode is the inode of the caller's network namespace: /run is shared
// by every namespace, the inode is not, so a file named by it belongs to
// one namespace's daemon.
func NetnsInode() (uint64, error) {
	fi, err := os.Stat("/proc/self/ns/net")
	if err != nil {
		return 0, fmt.Errorf("this process's network namespace: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, errors.New("this process's network namespace: no inode")
	}
	return st.Ino, nil
}

// DefaultPath is the control socket under dir of the daemon of the
// caller's network namespace (dir/netns-INODE.sock), so `onehop lab exec
// NODE -- onehop NOUN status` reaches NODE's daemon and no other.
func DefaultPath(dir string) (string, error) {
	ino, err := NetnsInode()
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, fmt.Sprintf("netns-%d.sock", ino)), nil
}

// Listener is a control socket this process owns: Close removes the
// socket file only while it is still the one this process bound, so a
// daemon that ends never removes a newer daemon's socket.
type Listener struct {
	*net.UnixListener
	path string
	dev  uint64
	ino  uint64
	lock *os.File

	once     sync.Once
	closeErr error
}

// Listen binds the control socket at path, mode 0600, making its
// directory if needed. A socket left behind by a daemon that died is
// replaced; one a live daemon still answers on, or a file that is not a
// socket, is refused. path.lock is held for the listener's life, so two
// daemons starting at once cannot both take path.
func Listen(path string) (*Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("control socket %s: %w", path, err)
	}
	lock, err := takeLock(path + ".lock")
	if err != nil {
		return nil, fmt.Errorf("control socket %s: %w", path, err)
	}
	l, err := listen(path)
	if err != nil {
		releaseLock(lock)
		return nil, fmt.Errorf("control socket %s: %w", path, err)
	}
	l.lock = lock
	return l, nil
}

func listen(path string) (*Listener, error) {
	if err := removeStale(path); err != nil {
		return nil, err
	}
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		/* Linux gives the socket file the mode of the socket's own inode
		   (less the umask) at bind: set it first, so the socket is never
		   open to others, not even between bind and chmod */
		var serr error
		if err := rc.Control(func(fd uintptr) { serr = unix.Fchmod(int(fd), uint32(Mode)) }); err != nil {
			return err
		}
		return serr
	}}
	nl, err := lc.Listen(context.Background(), "unix", path)
	if err != nil {
		return nil, err
	}
	ul := nl.(*net.UnixListener)
	// Close removes the file itself, and only if it is still ours.
	ul.SetUnlinkOnClose(false)
	fail := func(err error) (*Listener, error) {
		ul.Close()
		os.Remove(path)
		return nil, err
	}
	// The mode again, whatever the kernel did with the socket inode's.
	if err := os.Chmod(path, Mode); err != nil {
		return fail(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return fail(err)
	}
	return &Listener{UnixListener: ul, path: path, dev: st.Dev, ino: st.Ino}, nil
}

// removeStale clears path for a new socket: nothing there, or a socket
// nobody listens on any more. A live socket or another kind of file stays.
func removeStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("a %s is there, not a socket: refusing to replace it", describe(fi.Mode()))
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		c.Close()
		return errors.New("a daemon is already answering on it (stop that one first, or give another path)")
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("cannot tell whether a daemon still answers on it: %w", err)
	}
	// Refused: bound once, nobody listening now.
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("stale socket: %w", err)
	}
	return nil
}

func describe(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "directory"
	case m.IsRegular():
		return "regular file"
	case m&fs.ModeSymlink != 0:
		return "symbolic link"
	}
	return "file of mode " + m.String()
}

// takeLock holds an exclusive flock on path for the caller's life. The
// file is removed when released, so after locking it checks that the file
// it locked is still the one at path (a releaser may have removed it
// between our open and our lock) and tries again if not.
func takeLock(path string) (*os.File, error) {
	for range 10 {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			return nil, err
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
			f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				return nil, fmt.Errorf("another daemon holds %s (stop that one first, or give another path)", path)
			}
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		var held, there unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &held); err != nil {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		if err := unix.Stat(path, &there); err == nil && held.Dev == there.Dev && held.Ino == there.Ino {
			return f, nil
		}
		f.Close()
	}
	return nil, fmt.Errorf("lock %s: removed under us again and again", path)
}

// releaseLock removes the lock file while still holding it (so nobody
// locks a file about to vanish), then lets go.
func releaseLock(f *os.File) error {
	err := os.Remove(f.Name())
	if errors.Is(err, fs.ErrNotExist) {
		err = nil
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// Path is where the socket is.
func (l *Listener) Path() string { return l.path }

// Close stops listening and removes the socket file if it is still the
// one this listener bound (and its lock). Later calls do nothing.
func (l *Listener) Close() error {
	l.once.Do(func() {
		err := l.UnixListener.Close()
		var st unix.Stat_t
		if serr := unix.Stat(l.path, &st); serr == nil && st.Dev == l.dev && st.Ino == l.ino {
			if rerr := os.Remove(l.path); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) && err == nil {
				err = rerr
			}
		}
		if l.lock != nil {
			if lerr := releaseLock(l.lock); err == nil {
				err = lerr
			}
		}
		if err != nil {
			err = fmt.Errorf("control socket %s: close: %w", l.path, err)
		}
		l.closeErr = err
	})
	return l.closeErr
}
