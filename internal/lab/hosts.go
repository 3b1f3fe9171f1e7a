package lab

import (
	"context"
	"errors"
	"fmt"

	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/onehop/onehop/internal/client"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/netns"
	"github.com/onehop/onehop/internal/pki"
	"github.com/onehop/onehop/internal/topology"
)

// Hosts joining and leaving a lab that is up: the lab's side of `onehop
// host add` and `host remove`. A host added is built as lab up builds one
// (hostKind's plumb and start) and recorded in the state like the others,
// so status sees it and down removes it.

// AddHost authorizes host name with the controller (POST /v1/hosts, with a
// fabric address the lab allocates), then builds it in lab st: its
// namespace, its uplink on the fabric, its agent's certificate from the
// lab's CA, and its agent, which registers its uplink when it starts. It
// returns once the agent has reported, within opts.Timeout; what it could
// not finish is removed again, the host's record too.
func AddHost(ctx context.Context, st *State, name string, opts Options) (intent.Host, error) {
	h := intent.Host{Name: name}
	if st.Datapath != topology.DatapathOnehop || st.APISocket == "" {
		return h, fmt.Errorf("lab %q has no onehop datapath (%s): no agent to add", st.Name, st.Datapath)
	}
	if err := topology.CheckHostName(name); err != nil {
		return h, err
	}
	if k, taken := st.Kinds[name]; taken {
		return h, fmt.Errorf("lab %q already has a node %q (a %s)", st.Name, name, k)
	}
	t, err := topology.Load(st.Topology)
	if err != nil {
		return h, fmt.Errorf("lab %q: its topology, which its agents' flags come from: %w", st.Name, err)
	}
	used, err := fabricAddrsInUse(st)
	if err != nil {
		return h, err
	}
	addr, ok := topology.NextFabricAddr(t.FabricPrefix(), 10, func(a netip.Addr) bool { return used[a] })
	if !ok {
		return h, fmt.Errorf("no fabric address left for host %s on %s", name, t.FabricPrefix())
	}
	h.Address = addr.String()
	api := client.New(st.APISocket)
	if err := api.Do("POST", "/v1/hosts", h, &h); err != nil {
		return h, err
	}
	t.Hosts = append(t.Hosts, topology.Host{Name: name, Address: h.Address, Uplinks: 1, UplinkAddrs: []string{h.Address}})
	if err := buildHost(ctx, st, t, name, opts); err != nil {
		if rerr := removeHostNode(st, name); rerr != nil {
			err = errors.Join(err, fmt.Errorf("and removing what was built: %w", rerr))
		}
		if derr := api.Do("DELETE", "/v1/hosts/"+name, nil, nil); derr != nil {
			err = errors.Join(err, fmt.Errorf("and removing its record: %w", derr))
		}
		return h, err
	}
	return h, nil
}

// buildHost makes host name of t in lab st, as Up does, and waits for its
// agent.
func buildHost(ctx context.Context, st *State, t *topology.File, name string, opts Options) error {
	if err := opts.fill(); err != nil {
		return err
	}
	b := &builder{opts: opts, t: t, st: st, out: &progress{w: opts.Progress}}
	defer func() {
		if b.fabric != nil {
			b.fabric.Close()
		}
		if b.conn != nil {
			b.conn.Close()
		}
	}()
	fh, err := netns.Handle(NamespaceOf(st.Name, "fabric"))
	if err != nil {
		return err
	}
	b.fabric = fh
	ca, err := pki.LoadCA(CAFile(st), caKeyFile(st))
	if err != nil {
		return fmt.Errorf("lab %q's CA: %w", st.Name, err)
	}
	if err := issueAgentCert(st, ca, name, time.Now()); err != nil {
		return err
	}
	k := hostKind{}
	if err := k.plumb(ctx, b, name); err != nil {
		return err
	}
	if err := k.start(ctx, b, name); err != nil {
		return err
	}
	return b.poll(ctx, "the agent of "+name, func() (bool, string, error) {
		why, err := k.notReady(ctx, b, name)
		return why == "", why, err
	})
}

// RemoveHost retires host name from lab st: it stops the host's agent (a
// running one would write its node and status records again), has the
// controller remove the host (DELETE /v1/hosts/NAME, with drain: deleting
// what is placed there), and removes the host's namespace, certificate,
// pins and cgroup. If the controller refuses (guests placed there, no
// drain), the agent is started again and the refusal returned.
func RemoveHost(st *State, name string, drain bool, binary string) error {
	if k := st.Kinds[name]; k != "host" {
		if k == "" {
			return fmt.Errorf("lab %q has no host %q", st.Name, name)
		}
		return fmt.Errorf("%s is a %s, not a host", name, k)
	}
	if binary == "" {
		exe, err := os.Executable()
		if err != nil {
			return err
		}
		binary = exe
	}
	var agent *Process
	for i := range st.Processes {
		if p := &st.Processes[i]; p.Node == name && alive(p.PID) {
			if err := stop(p.PID); err != nil {
				return err
			}
			agent = p
		}
	}
	path := "/v1/hosts/" + url.PathEscape(name)
	if drain {
		path += "?drain=true"
	}
	if err := client.New(st.APISocket).Do("DELETE", path, nil, nil); err != nil {
		if agent != nil {
			if serr := start(binary, agent); serr != nil {
				err = errors.Join(err, fmt.Errorf("and starting its agent again: %w", serr))
			} else if serr := st.save(); serr != nil {
				err = errors.Join(err, serr)
			}
		}
		return err
	}
	return removeHostNode(st, name)
}

// removeHostNode removes what the lab made for host name and forgets it.
func removeHostNode(st *State, name string) error {
	var errs []error
	for _, p := range st.Processes {
		if p.Node == name && alive(p.PID) {
			if err := stop(p.PID); err != nil {
				errs = append(errs, err)
			}
		}
	}
	st.Processes = slices.DeleteFunc(st.Processes, func(p Process) bool { return p.Node == name })
	ns := NamespaceOf(st.Name, name)
	// What an operator started in the node would outlive it, as in lab down;
	// what was ended goes to stderr, as lab down's progress does.
	if err := endLeftovers(st.Name, []string{ns}, func(format string, a ...any) {
		fmt.Fprintf(os.Stderr, format+"\n", a...)
	}); err != nil {
		errs = append(errs, err)
	}
	if netns.Exists(ns) {
		// The uplink's fabric end goes with it: a veth pair dies whole.
		if err := netns.Delete(ns); err != nil {
			errs = append(errs, err)
		}
	}
	st.Namespaces = slices.DeleteFunc(st.Namespaces, func(n string) bool { return n == ns })
	delete(st.Kinds, name)
	f := TLSFiles(st, "agent-"+name)
	for _, path := range []string{f.Cert, f.Key} {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if st.BPFFS != "" {
		if err := os.RemoveAll(filepath.Join(st.BPFFS, name)); err != nil {
			errs = append(errs, fmt.Errorf("pins of %s: %w", name, err))
		}
	}
	if st.CgroupFS != "" {
		if err := os.Remove(HostCgroupDir(st, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("cgroup of %s: %w", name, err))
		}
	}
	if err := st.save(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
