package lab

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/netns"
	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/topology"
)

// Interface names inside the lab.
const (
	FabricBridge = "br0"     // the underlay switch, in the fabric namespace
	HostUplink   = "uplink0" // a host's NIC on the fabric
	VMInterface  = "eth0"    // a VM's NIC
	ctlInterface = "mgmt0"   // the controller's NIC on the fabric
	etcdPort     = 2379
	MetricsPort  = 9100 // each agent's, gateway's and xTR's operations port, on its node's loopback (no guest reaches it)
)

// Options tune Up.
type Options struct {
	Root     string    // state root, DefaultRoot if empty
	Binary   string    // the onehop binary daemons run from; this process's if empty
	Progress io.Writer // one line per step; nil for quiet
	Timeout  time.Duration
}

// fill gives the timeout and binary left out their defaults.
func (o *Options) fill() error {
	if o.Timeout == 0 {
		o.Timeout = 60 * time.Second
	}
	if o.Binary == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("find onehop binary: %w", err)
		}
		o.Binary = exe
	}
	return nil
}

// builder is one run of Up: what the kinds build with and record into.
type builder struct {
	opts Options
	t    *topology.File
	st   *State
	out  *progress
	// fabric is a netlink handle in the fabric namespace, once it exists.
	fabric *netlink.Handle
	// vms are the VMs' allocations, read once when the first VM needs one.
	vms map[string]intent.VM
	// conn is the connection to the lab's etcd, once the controller answers.
	conn store.Store
}

// step reports one step of the build.
func (b *builder) step(format string, a ...any) { b.out.printf("  - "+format+"\n", a...) }

// progress writes progress lines until a write fails, then drops them: a
// reader that went away (`lab up | head -3`) must not stop a build halfway.
type progress struct {
	mu     sync.Mutex
	w      io.Writer
	broken bool
}

func (p *progress) printf(format string, a ...any) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.w == nil || p.broken {
		return
	}
	if _, err := fmt.Fprintf(p.w, format, a...); err != nil {
		p.broken = true
	}
}

// survivePipes keeps a closed stdout or stderr from killing this process.
// Go dies of SIGPIPE on a write to a closed pipe on fd 1 or 2 unless SIGPIPE
// is being notified; then the write returns EPIPE, which progress absorbs.
// It stays that way for the rest of the process: whatever it prints after
// Up (a summary, an error) must not kill it either. Daemons do not inherit
// it: a caught signal is reset to its default across exec.
var survivePipes = sync.OnceFunc(func() {
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
})

// Up builds the lab described by t. On failure, or when ctx ends (SIGINT or
// SIGTERM in the CLI), everything it made is removed again, so an up that
// did not finish never leaves a half-built lab behind.
func Up(ctx context.Context, t *topology.File, opts Options) (*State, error) {
	survivePipes()
	if opts.Root == "" {
		opts.Root = DefaultRoot
	}
	if err := opts.fill(); err != nil {
		return nil, err
	}
	dir := filepath.Join(opts.Root, t.Name)
	if _, err := os.Stat(stateFile(dir)); err == nil {
		return nil, fmt.Errorf("lab %q is already up (state in %s); run `onehop lab down --lab %s` first", t.Name, dir, t.Name)
	}
	if left, _ := netns.List(NamespaceOf(t.Name, "")); len(left) > 0 {
		return nil, fmt.Errorf("lab %q: namespaces %v already exist; run `onehop lab down --lab %s` to remove them", t.Name, left, t.Name)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create lab state dir: %w", err)
	}
	topoPath, err := filepath.Abs(t.Path)
	if err != nil {
		return nil, fmt.Errorf("topology path %s: %w", t.Path, err)
	}
	st := &State{
		Name: t.Name, Topology: topoPath, Datapath: t.Datapath, Dir: dir,
		BPFFS:      filepath.Join(dir, "bpffs"),
		EtcdSocket: filepath.Join(dir, "etcd.sock"),
		APISocket:  filepath.Join(dir, "api.sock"),
		EtcdURL:    fmt.Sprintf("https://%s", net.JoinHostPort(t.Fabric.Controller, fmt.Sprint(etcdPort))),
		Phase:      "building", Created: time.Now().UTC(),
	}
	if err := st.save(); err != nil {
		return nil, err
	}
	b := &builder{opts: opts, t: t, st: st, out: &progress{w: opts.Progress}}
	err = b.build(ctx)
	if b.fabric != nil {
		b.fabric.Close()
	}
	if b.conn != nil {
		b.conn.Close()
	}
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("lab up interrupted (%w); what it had built is removed", err)
		} else if kept := keepLogs(st); kept != "" {
			err = fmt.Errorf("%w\n(daemon logs kept in %s)", err, kept)
		}
		if derr := Teardown(st, nil); derr != nil {
			err = fmt.Errorf("%w (and cleaning up: %v)", err, derr)
		}
		return nil, err
	}
	st.Phase = "up"
	return st, st.save()
}

// build drives every kind through plumb and start, then waits for every
// waiter and activates every activator (see nodeKind).
func (b *builder) build(ctx context.Context) error {
	for _, k := range kinds {
		nodes := k.nodes(b.t)
		for _, n := range nodes {
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := k.plumb(ctx, b, n); err != nil {
				return err
			}
		}
		if s, ok := k.(starter); ok {
			for _, n := range nodes {
				if err := ctx.Err(); err != nil {
					return err
				}
				if err := s.start(ctx, b, n); err != nil {
					return err
				}
			}
		}
	}
	if err := b.waitReady(ctx); err != nil {
		return err
	}
	for _, k := range kinds {
		a, ok := k.(activator)
		if !ok {
			continue
		}
		for _, n := range k.nodes(b.t) {
			if err := a.activate(ctx, b, n); err != nil {
				return err
			}
		}
	}
	return nil
}

// waitReady polls every waiter until none has a node left to wait for.
func (b *builder) waitReady(ctx context.Context) error {
	announced := false
	return b.poll(ctx, "the lab to be ready", func() (bool, string, error) {
		var notReady []string
		for _, k := range kinds {
			w, ok := k.(waiter)
			if !ok {
				continue
			}
			for _, n := range k.nodes(b.t) {
				why, err := w.notReady(ctx, b, n)
				if err != nil {
					return false, "", err
				}
				if why != "" {
					notReady = append(notReady, n+": "+why)
				}
			}
		}
		if len(notReady) > 0 && !announced {
			b.step("waiting for %s", strings.Join(notReady, "; "))
			announced = true
		}
		return len(notReady) == 0, strings.Join(notReady, "; "), nil
	})
}

// poll calls check every 200 ms until it reports done, fails, a daemon of
// the lab dies, ctx ends or the build's timeout passes. last says what the
// lab is still waiting for, for the timeout's error.
func (b *builder) poll(ctx context.Context, what string, check func() (done bool, last string, err error)) error {
	deadline := time.Now().Add(b.opts.Timeout)
	for {
		if err := b.checkProcesses(); err != nil {
			return err
		}
		done, last, err := check()
		if err != nil || done {
			return err
		}
		if time.Now().After(deadline) {
			if last == "" {
				last = "no answer"
			}
			return fmt.Errorf("timed out after %s waiting for %s (%s); logs in %s", b.opts.Timeout, what, last, b.st.Dir)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}
