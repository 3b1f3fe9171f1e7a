package lab

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/ipam"
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
	MetricsPort  = 9100 // each agent's /metrics, on its host's fabric address
)

// Options tune Up.
type Options struct {
	Root     string    // state root, DefaultRoot if empty
	Binary   string    // the onehop binary daemons run from; this process's if empty
	Progress io.Writer // one line per step; nil for quiet
	Timeout  time.Duration
}

type builder struct {
	opts Options
	t    *topology.File
	st   *State
	out  io.Writer
}

func (b *builder) step(format string, a ...any) {
	if b.out != nil {
		fmt.Fprintf(b.out, "  - "+format+"\n", a...)
	}
}

// Up builds the lab described by t. On failure everything it made is removed
// again, so a failed up never leaves a half-built lab behind.
func Up(ctx context.Context, t *topology.File, opts Options) (*State, error) {
	if opts.Root == "" {
		opts.Root = DefaultRoot
	}
	if opts.Timeout == 0 {
		opts.Timeout = 60 * time.Second
	}
	if opts.Binary == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("find onehop binary: %w", err)
		}
		opts.Binary = exe
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
	topoPath, _ := filepath.Abs(t.Path)
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
	b := &builder{opts: opts, t: t, st: st, out: opts.Progress}
	if err := b.build(ctx); err != nil {
		if kept := keepLogs(st); kept != "" {
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

func (b *builder) build(ctx context.Context) error {
	t, st := b.t, b.st
	fabric := t.FabricPrefix()
	fabricNS := NamespaceOf(t.Name, "fabric")
	b.step("fabric %s: bridge %s for %s", fabricNS, FabricBridge, fabric)
	if err := b.newNamespace(fabricNS, "fabric"); err != nil {
		return err
	}
	// A switch reports no multicast memberships of its own.
	if err := netns.WriteSysctl(fabricNS, "net/ipv4/igmp_link_local_mcast_reports", "0"); err != nil {
		return err
	}
	fh, err := netns.Handle(fabricNS)
	if err != nil {
		return err
	}
	defer fh.Close()
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: FabricBridge}}
	if err := fh.LinkAdd(br); err != nil {
		return fmt.Errorf("create fabric bridge: %w", err)
	}
	// The fabric is a switch, not a host: without this its ports and the
	// bridge itself (address-less IPv4 devices) send IGMP reports from
	// 0.0.0.0 onto the wire.
	if err := fh.LinkSetMulticastOff(br); err != nil {
		return fmt.Errorf("fabric bridge: %w", err)
	}
	if err := fh.LinkSetUp(br); err != nil {
		return fmt.Errorf("bring up fabric bridge: %w", err)
	}

	if t.Datapath == topology.DatapathOnehop {
		if err := b.mountBPFFS(); err != nil {
			return err
		}
		ctlNS := NamespaceOf(t.Name, "controller")
		b.step("controller %s at %s (embedded etcd, data in %s)", ctlNS, t.Fabric.Controller, filepath.Join(st.Dir, "etcd"))
		if err := b.newNamespace(ctlNS, "controller"); err != nil {
			return err
		}
		if err := b.plugIntoFabric(fh, ctlNS, "p-controller", ctlInterface, t.Fabric.Controller, fabric.Bits()); err != nil {
			return err
		}
		if err := b.makePKI(); err != nil {
			return err
		}
		if err := b.spawn("controller", "controller", ctlNS, append([]string{"controller",
			"--data-dir", filepath.Join(st.Dir, "etcd"),
			"--client-url", st.EtcdURL,
			"--socket", st.EtcdSocket,
			"--api-socket", st.APISocket,
			"--topology", st.Topology}, b.controllerTLSArgs()...)...); err != nil {
			return err
		}
	}

	for _, h := range t.Hosts {
		hostNS := NamespaceOf(t.Name, h.Name)
		b.step("host %s (%s): uplink %s %s/%d", h.Name, hostNS, HostUplink, h.Address, fabric.Bits())
		if err := b.newNamespace(hostNS, "host"); err != nil {
			return err
		}
		addr := h.Address
		if t.Datapath == topology.DatapathBridge {
			addr = "" // the address goes on the host's bridge instead
		}
		if err := b.plugIntoFabric(fh, hostNS, "p-"+h.Name, HostUplink, addr, fabric.Bits()); err != nil {
			return err
		}
		if t.Datapath == topology.DatapathBridge {
			if err := b.hostBridge(hostNS, h.Address, fabric.Bits()); err != nil {
				return err
			}
		}
	}

	vms, err := b.allocations(ctx)
	if err != nil {
		return err
	}
	for _, vm := range t.VMs {
		st.VMs = append(st.VMs, vms[vm.Name])
	}
	if t.Datapath == topology.DatapathOnehop {
		for _, h := range t.Hosts {
			hostNS := NamespaceOf(t.Name, h.Name)
			b.step("agent on %s (metrics on http://%s:%d/metrics)", h.Name, h.Address, MetricsPort)
			args := append([]string{"agent",
				"--node", h.Name,
				"--etcd-endpoints", st.EtcdURL,
				"--uplink", HostUplink,
				"--bpffs", st.BPFFS,
				"--metrics-addr", fmt.Sprintf(":%d", MetricsPort)}, t.ARP.AgentArgs()...)
			args = append(args, b.agentTLSArgs(h.Name)...)
			if err := b.spawn("agent-"+h.Name, h.Name, hostNS, args...); err != nil {
				return err
			}
		}
	}
	for _, vm := range t.VMs {
		v := vms[vm.Name]
		how := "static"
		if vm.DHCP {
			how = "by DHCP"
		}
		b.step("vm %s on %s: %s %s gw %s (%s)", vm.Name, vm.Host, v.IP, v.MAC, v.Gateway, how)
		if err := b.plugVM(vm, v); err != nil {
			return err
		}
	}
	if t.Datapath == topology.DatapathOnehop {
		b.step("waiting for every agent to program its datapath")
		if err := b.waitAgents(ctx); err != nil {
			return err
		}
	}
	return nil
}

func (b *builder) newNamespace(name, kind string) error {
	if err := netns.Create(name); err != nil {
		return err
	}
	b.st.Namespaces = append(b.st.Namespaces, name)
	if b.st.Kinds == nil {
		b.st.Kinds = map[string]string{}
	}
	b.st.Kinds[strings.TrimPrefix(name, NamespaceOf(b.st.Name, ""))] = kind
	if err := b.st.save(); err != nil {
		return err
	}
	// The lab carries IPv4 only; IPv6 autoconfiguration would put router
	// solicitations and DAD on the fabric and in the drop counters.
	for _, k := range []string{"net/ipv6/conf/default/disable_ipv6", "net/ipv6/conf/all/disable_ipv6"} {
		if err := netns.WriteSysctl(name, k, "1"); err != nil {
			return err
		}
	}
	return nil
}

// plugIntoFabric connects namespace ns to the fabric bridge with a veth pair
// (fabricEnd on the bridge, inner inside ns) and gives inner addr/bits.
func (b *builder) plugIntoFabric(fh *netlink.Handle, ns, fabricEnd, inner, addr string, bits int) error {
	nsFd, err := netns.Fd(ns)
	if err != nil {
		return err
	}
	defer nsFd.Close()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: fabricEnd}, PeerName: inner, PeerNamespace: netlink.NsFd(int(nsFd))}
	if err := fh.LinkAdd(veth); err != nil {
		return fmt.Errorf("create %s<->%s: %w", fabricEnd, inner, err)
	}
	br, err := fh.LinkByName(FabricBridge)
	if err != nil {
		return err
	}
	if err := fh.LinkSetMaster(veth, br); err != nil {
		return fmt.Errorf("attach %s to fabric: %w", fabricEnd, err)
	}
	if err := fh.LinkSetMulticastOff(veth); err != nil {
		return fmt.Errorf("%s: %w", fabricEnd, err)
	}
	if err := fh.LinkSetUp(veth); err != nil {
		return err
	}
	h, err := netns.Handle(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	l, err := h.LinkByName(inner)
	if err != nil {
		return fmt.Errorf("%s in %s: %w", inner, ns, err)
	}
	if addr != "" {
		if err := h.AddrAdd(l, &netlink.Addr{IPNet: ipNet(addr, bits)}); err != nil {
			return fmt.Errorf("address %s on %s in %s: %w", addr, inner, ns, err)
		}
	}
	return h.LinkSetUp(l)
}

// hostBridge makes a bridge-mode host: uplink and vifs on one Linux bridge
// that carries the host's address, as a hypervisor without onehop would.
func (b *builder) hostBridge(ns, addr string, bits int) error {
	h, err := netns.Handle(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0"}}
	if err := h.LinkAdd(br); err != nil {
		return fmt.Errorf("host bridge in %s: %w", ns, err)
	}
	up, err := h.LinkByName(HostUplink)
	if err != nil {
		return err
	}
	if err := h.LinkSetMaster(up, br); err != nil {
		return err
	}
	if err := h.AddrAdd(br, &netlink.Addr{IPNet: ipNet(addr, bits)}); err != nil {
		return err
	}
	return h.LinkSetUp(br)
}

func ipNet(addr string, bits int) *net.IPNet {
	return &net.IPNet{IP: net.ParseIP(addr).To4(), Mask: net.CIDRMask(bits, 32)}
}

func (b *builder) mountBPFFS() error {
	if err := os.MkdirAll(b.st.BPFFS, 0o700); err != nil {
		return err
	}
	if err := MountBPFFS(b.st.BPFFS); err != nil {
		return err
	}
	b.step("bpffs for pinned maps and links at %s", b.st.BPFFS)
	return nil
}

// MountBPFFS mounts a bpffs at dir unless one is there already. The lab keeps
// it outside /sys because `ip netns exec` remounts /sys and would hide pins.
func MountBPFFS(dir string) error {
	var sfs unix.Statfs_t
	if err := unix.Statfs(dir, &sfs); err == nil && sfs.Type == unix.BPF_FS_MAGIC {
		return nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := unix.Mount("bpffs", dir, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("mount bpffs at %s: %w", dir, err)
	}
	return nil
}

func (b *builder) spawn(name, node, ns string, args ...string) error {
	p := Process{Name: name, Node: node, Netns: ns, Args: args, Log: filepath.Join(b.st.Dir, name+".log")}
	if err := start(b.opts.Binary, &p); err != nil {
		return err
	}
	b.st.Processes = append(b.st.Processes, p)
	return b.st.save()
}

// start runs p inside its namespace as a daemon that outlives this command.
func start(binary string, p *Process) error {
	logf, err := os.OpenFile(p.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	argv := append([]string{"netns-exec", p.Netns, "--", binary}, p.Args...)
	cmd := exec.Command(binary, argv...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", p.Name, err)
	}
	p.PID = cmd.Process.Pid
	go func() { // reap it if it dies while this command still runs, and say how
		err := cmd.Wait()
		if err == nil {
			err = errors.New("exited with status 0")
		}
		exits.Store(p.PID, err)
	}()
	return nil
}

// exits holds how daemons started by this process ended, by pid.
var exits sync.Map

// Restart stops the lab daemon running on node (if it still runs) and starts
// it again with the same arguments, e.g. to show that an agent restart does
// not interrupt traffic.
func Restart(st *State, node string, binary string) (*Process, error) {
	if binary == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, err
		}
		binary = exe
	}
	for i := range st.Processes {
		p := &st.Processes[i]
		if p.Node != node {
			continue
		}
		if alive(p.PID) {
			if err := stop(p.PID); err != nil {
				return nil, err
			}
		}
		if err := start(binary, p); err != nil {
			return nil, err
		}
		return p, st.save()
	}
	return nil, fmt.Errorf("lab %q runs no daemon on %q (daemons run on hosts and the controller)", st.Name, node)
}

// allocations returns each VM's address: read back from the controller in
// onehop mode (it is the only allocator), computed locally in bridge mode
// (no controller runs there; the same allocator gives the same addresses).
func (b *builder) allocations(ctx context.Context) (map[string]intent.VM, error) {
	out := map[string]intent.VM{}
	if b.t.Datapath == topology.DatapathBridge {
		var a ipam.Allocations
		for _, vm := range b.t.VMs {
			ip, err := a.VM(vm.Farm(), vm.SubnetName(), vm.Name)
			if err != nil {
				return nil, err
			}
			out[vm.Name] = intent.NewVM(vm.Farm(), vm.SubnetName(), vm.Name, vm.Host, ip)
		}
		return out, nil
	}
	b.step("waiting for the controller to allocate %d VM addresses", len(b.t.VMs))
	deadline := time.Now().Add(b.opts.Timeout)
	for {
		if err := b.checkProcesses(); err != nil {
			return nil, err
		}
		vms, err := b.readVMs(ctx)
		if err == nil && len(vms) == len(b.t.VMs) {
			for _, v := range vms {
				out[v.Name] = v
			}
			return out, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("controller did not allocate addresses within %s (last: %v); see %s",
				b.opts.Timeout, err, filepath.Join(b.st.Dir, "controller.log"))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (b *builder) readVMs(ctx context.Context) ([]intent.VM, error) {
	if _, err := os.Stat(b.st.EtcdSocket); err != nil {
		return nil, errors.New("etcd socket not there yet")
	}
	s, err := store.DialEtcd([]string{"unix://" + b.st.EtcdSocket})
	if err != nil {
		return nil, err
	}
	defer s.Close()
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	vms, _, err := store.ListJSON[intent.VM](cctx, s, intent.VMsPrefix)
	return vms, err
}

// checkProcesses fails fast when a daemon died, with the end of its log.
func (b *builder) checkProcesses() error {
	for _, p := range b.st.Processes {
		if !alive(p.PID) {
			how := "exited"
			if e, ok := exits.Load(p.PID); ok {
				how = fmt.Sprintf("exited (%v)", e)
			}
			return fmt.Errorf("%s %s during lab up; its log %s ends with:\n%s", p.Name, how, p.Log, tail(p.Log, 10))
		}
	}
	return nil
}

func (b *builder) plugVM(vm topology.VM, v intent.VM) error {
	hostNS := NamespaceOf(b.t.Name, vm.Host)
	vmNS := NamespaceOf(b.t.Name, vm.Name)
	if err := b.newNamespace(vmNS, "vm"); err != nil {
		return err
	}
	mac, err := net.ParseMAC(v.MAC)
	if err != nil {
		return fmt.Errorf("vm %s: MAC %q: %w", vm.Name, v.MAC, err)
	}
	ip, err := netip.ParseAddr(v.IP)
	if err != nil {
		return fmt.Errorf("vm %s: address %q: %w", vm.Name, v.IP, err)
	}
	vmFd, err := netns.Fd(vmNS)
	if err != nil {
		return err
	}
	defer vmFd.Close()
	hh, err := netns.Handle(hostNS)
	if err != nil {
		return err
	}
	defer hh.Close()
	vifName := topology.VifName(vm.Name)
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: vifName}, PeerName: VMInterface,
		PeerHardwareAddr: mac, PeerNamespace: netlink.NsFd(int(vmFd))}
	if err := hh.LinkAdd(veth); err != nil {
		return fmt.Errorf("create vif %s for %s: %w", vifName, vm.Name, err)
	}
	if b.t.Datapath == topology.DatapathBridge {
		br, err := hh.LinkByName("br0")
		if err != nil {
			return err
		}
		if err := hh.LinkSetMaster(veth, br); err != nil {
			return err
		}
	}
	if err := hh.LinkSetUp(veth); err != nil {
		return err
	}
	vh, err := netns.Handle(vmNS)
	if err != nil {
		return err
	}
	defer vh.Close()
	eth, err := vh.LinkByName(VMInterface)
	if err != nil {
		return err
	}
	if vm.DHCP {
		return vh.LinkSetUp(eth) // the VM asks for its address itself
	}
	if err := vh.AddrAdd(eth, &netlink.Addr{IPNet: ipNet(ip.String(), 24)}); err != nil {
		return fmt.Errorf("vm %s address: %w", vm.Name, err)
	}
	if err := vh.LinkSetUp(eth); err != nil {
		return err
	}
	gw := net.ParseIP(v.Gateway)
	if err := vh.RouteAdd(&netlink.Route{LinkIndex: eth.Attrs().Index, Gw: gw}); err != nil {
		return fmt.Errorf("vm %s default route via %s: %w", vm.Name, gw, err)
	}
	return nil
}

// waitAgents waits until every host's agent reports the digest of the
// desired state the controller wrote for it, with every vif attached.
func (b *builder) waitAgents(ctx context.Context) error {
	s, err := store.DialEtcd([]string{"unix://" + b.st.EtcdSocket})
	if err != nil {
		return err
	}
	defer s.Close()
	deadline := time.Now().Add(b.opts.Timeout)
	for {
		if err := b.checkProcesses(); err != nil {
			return err
		}
		notReady := b.agentsNotReady(ctx, s)
		if len(notReady) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("agents not ready within %s: %s; logs in %s", b.opts.Timeout, strings.Join(notReady, "; "), b.st.Dir)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (b *builder) agentsNotReady(ctx context.Context, s store.Store) []string {
	var notReady []string
	for _, h := range b.t.Hosts {
		var d intent.Desired
		var st intent.AgentStatus
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		derr := store.GetJSON(cctx, s, intent.DesiredPrefix+h.Name, &d)
		serr := store.GetJSON(cctx, s, intent.StatusPrefix+h.Name, &st)
		cancel()
		want := 0
		for _, vm := range b.t.VMs {
			if vm.Host == h.Name {
				want++
			}
		}
		switch {
		case derr != nil:
			notReady = append(notReady, h.Name+": no desired state yet")
		case serr != nil:
			notReady = append(notReady, h.Name+": agent has not reported")
		case st.Error != "":
			notReady = append(notReady, h.Name+": "+st.Error)
		case st.AppliedDigest != d.Digest() || len(st.MissingVifs) > 0 || len(st.AttachedVifs) != want:
			notReady = append(notReady, fmt.Sprintf("%s: applied %d/%d vifs", h.Name, len(st.AttachedVifs), want))
		}
	}
	return notReady
}

// keepLogs copies the daemons' logs out of a lab that is about to be torn
// down after a failed up, so the reason survives; returns where, or "".
func keepLogs(st *State) string {
	if len(st.Processes) == 0 {
		return ""
	}
	dir, err := os.MkdirTemp("", "onehop-failed-"+st.Name+"-")
	if err != nil {
		return ""
	}
	for _, p := range st.Processes {
		if b, err := os.ReadFile(p.Log); err == nil {
			os.WriteFile(filepath.Join(dir, filepath.Base(p.Log)), b, 0o600)
		}
	}
	return dir
}
