package bpfobj

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// Links are the links one loader attached, by name. With a pin directory
// each is pinned there, so its program stays attached after the process
// exits, and the next process takes the pinned link over: it gives the link
// its freshly loaded program in place, and the hook is never empty.
type Links struct {
	dir  string // "" pins nothing
	held map[string]link.Link
}

// NewLinks keeps links pinned under dir (a directory on a bpffs, made when
// the first link is pinned); "" pins nothing.
func NewLinks(dir string) *Links {
	return &Links{dir: dir, held: map[string]link.Link{}}
}

// pin is where the link named name is pinned: a pin's name has no "/".
func (l *Links) pin(name string) string {
	return filepath.Join(l.dir, strings.ReplaceAll(name, "/", "_"))
}

// Attach makes sure prog is attached as the link named name. A link of that
// name this process holds, or one pinned by an earlier process, is kept when
// same says it is on the right hook (nil: any link of the name is; a pinned
// one is given prog); any other is taken off first. attach makes a new link.
func (l *Links) Attach(name string, prog *ebpf.Program, same func(*link.Info) bool, attach func() (link.Link, error)) error {
	onHook := func(x link.Link) bool {
		if same == nil {
			return true
		}
		info, err := x.Info()
		return err == nil && same(info)
	}
	if h, ok := l.held[name]; ok {
		if onHook(h) {
			return nil
		}
		l.drop(name)
	}
	if l.dir != "" {
		if p, err := link.LoadPinnedLink(l.pin(name), nil); err == nil {
			if onHook(p) && p.Update(prog) == nil {
				l.held[name] = p
				return nil
			}
			p.Unpin()
			p.Close()
		}
	}
	n, err := attach()
	if err != nil {
		return err
	}
	if l.dir != "" {
		if err := os.MkdirAll(l.dir, 0o700); err != nil {
			n.Close()
			return fmt.Errorf("pin dir: %w", err)
		}
		if err := n.Pin(l.pin(name)); err != nil {
			n.Close()
			return fmt.Errorf("pin link %s: %w", name, err)
		}
	}
	l.held[name] = n
	return nil
}

// TCX makes sure prog is on ifindex's tcx hook at, as the link named name
// (Attach); a link on another ifindex (the interface was made again) or
// hook is replaced.
func (l *Links) TCX(name, ifname string, ifindex int, prog *ebpf.Program, at ebpf.AttachType) error {
	return l.Attach(name, prog, func(info *link.Info) bool {
		return info.TCX() != nil && int(info.TCX().Ifindex) == ifindex && uint32(info.TCX().AttachType) == uint32(at)
	}, func() (link.Link, error) {
		n, err := link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: prog, Attach: at})
		if err != nil {
			return nil, fmt.Errorf("attach tcx %s to %s (ifindex %d): %w", at, ifname, ifindex, err)
		}
		return n, nil
	})
}

// drop unpins and closes a held link: its program comes off the hook.
func (l *Links) drop(name string) error {
	h := l.held[name]
	delete(l.held, name)
	var errs []error
	if l.dir != "" {
		if err := h.Unpin(); err != nil {
			errs = append(errs, fmt.Errorf("unpin %s: %w", name, err))
		}
	}
	if err := h.Close(); err != nil {
		errs = append(errs, fmt.Errorf("detach %s: %w", name, err))
	}
	return errors.Join(errs...)
}

// Detach takes the link named name off its hook, held or only pinned (by
// an earlier process); a link that is not there is no error. A pin whose
// link went with its device leaves only the file, which goes too.
func (l *Links) Detach(name string) error {
	if _, ok := l.held[name]; ok {
		return l.drop(name)
	}
	if l.dir == "" {
		return nil
	}
	pin := l.pin(name)
	p, err := link.LoadPinnedLink(pin, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		if rerr := os.Remove(pin); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			return fmt.Errorf("remove pin %s: %w", pin, rerr)
		}
		return nil
	}
	p.Unpin()
	return p.Close()
}

// Held lists the links this process holds, by name, sorted.
func (l *Links) Held() []string {
	out := make([]string, 0, len(l.held))
	for name := range l.held {
		out = append(out, name)
	}
	sort.Strings(out)
	return out
}

// Names lists the links this process holds and those pinned by an earlier
// one, by name (a pinned link's name is its pin's), sorted.
func (l *Links) Names() ([]string, error) {
	seen := map[string]bool{}
	for name := range l.held {
		seen[name] = true
	}
	if l.dir != "" {
		entries, err := os.ReadDir(l.dir)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("read link pins: %w", err)
		}
		for _, de := range entries {
			seen[de.Name()] = true
		}
	}
	out := make([]string, 0, len(seen))
	for name := range seen {
		out = append(out, name)
	}
	sort.Strings(out)
	return out, nil
}

// Close lets go of this process's handles. Pinned links stay attached;
// the others come off their hooks.
func (l *Links) Close() error {
	verb := "detach"
	if l.dir != "" {
		verb = "close link"
	}
	var errs []error
	for name, h := range l.held {
		if err := h.Close(); err != nil {
			errs = append(errs, fmt.Errorf("%s %s: %w", verb, name, err))
		}
		delete(l.held, name)
	}
	return errors.Join(errs...)
}
