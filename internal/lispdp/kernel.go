package lispdp

import (
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/onehop/onehop/internal/bpfobj"
	onehopns "github.com/onehop/onehop/internal/netns"
)

// Kernel is the LISP data plane loaded into the kernel: the programs, their
// maps and the links attaching them.
type Kernel struct {
	opts  Options
	objs  lispObjects
	links *bpfobj.Links // never pinned

	mu    sync.Mutex
	paths map[uint8]lispLispPath // configured paths, for the tunnel maps
	// counterNames index lisp_counters (enum lisp_counter, from BTF).
	counterNames []string
	// gsoDecap: this kernel decapsulates UDP-tunnel superpackets in place.
	gsoDecap bool
}

// Open loads the programs and maps; nothing is attached yet.
func Open(o Options) (*Kernel, error) {
	spec, err := loadLisp()
	if err != nil {
		return nil, fmt.Errorf("lispdp: load spec: %w", err)
	}
	// "encapsulated", ..., "drop_malformed", ... (enum lisp_counter)
	names, err := bpfobj.EnumNames(spec, "lisp_counter", "LISP_")
	if err != nil {
		return nil, fmt.Errorf("lispdp: %w", err)
	}
	d := &Kernel{opts: o, links: bpfobj.NewLinks(""), paths: map[uint8]lispLispPath{},
		counterNames: names}
	if err := spec.LoadAndAssign(&d.objs, nil); err != nil {
		return nil, fmt.Errorf("lispdp: load programs: %+v", err)
	}
	if d.gsoDecap, err = probeGSODecap(d.objs.LispProbe); err != nil {
		d.objs.Close()
		return nil, err
	}
	return d, nil
}

// probeGSODecap asks the kernel whether bpf_skb_adjust_room knows
// BPF_F_ADJ_ROOM_DECAP_L4_UDP, which takes a superpacket's UDP-tunnel GSO
// state off with its outer headers (kernels after 6.18).
func probeGSODecap(prog *ebpf.Program) (bool, error) {
	f := make([]byte, 14+20+8+8+20)
	f[12], f[13] = 0x08, 0x00
	f[14], f[16], f[17], f[22], f[23] = 0x45, 0, byte(len(f)-14), 64, 17
	ret, err := prog.Run(&ebpf.RunOptions{Data: f, DataOut: make([]byte, len(f)+64)})
	if err != nil {
		return false, fmt.Errorf("lispdp: probe adjust_room flags: %w", err)
	}
	return ret == 0, nil
}

// DecapsGSO reports whether this kernel can decapsulate a UDP-tunnel GSO
// superpacket in place. Where it cannot, AttachRLOC makes the interface
// segment tunnel superpackets before they leave (tx-udp_tnl-segmentation
// off), so this node never sends any; the far end must do the same.
func (d *Kernel) DecapsGSO() bool { return d.gsoDecap }

// Programs are the loaded programs, for BPF_PROG_RUN tests and benchmarks.
type Programs struct {
	Encap   *ebpf.Program // tcx egress of an RLOC interface
	EncapIn *ebpf.Program // tcx ingress of an EID-facing interface
	Decap   *ebpf.Program // tcx ingress of an RLOC interface
}

// Programs returns the loaded programs, for BPF_PROG_RUN tests and benchmarks.
func (d *Kernel) Programs() Programs {
	return Programs{Encap: d.objs.LispEncap, EncapIn: d.objs.LispEncapIn, Decap: d.objs.LispDecap}
}

// Close detaches every link and unloads the programs.
func (d *Kernel) Close() error {
	var errs []error
	if err := d.links.Close(); err != nil {
		errs = append(errs, fmt.Errorf("lispdp: %w", err))
	}
	if err := d.objs.Close(); err != nil {
		errs = append(errs, fmt.Errorf("lispdp: unload: %w", err))
	}
	return errors.Join(errs...)
}

type attachment struct {
	name string
	prog *ebpf.Program
	at   ebpf.AttachType
}

func (d *Kernel) attach(ifname string, as []attachment, noTunnelGSO bool) error {
	return onehopns.DoPath(d.opts.Netns, func() error {
		ifc, err := netlink.LinkByName(ifname)
		if err != nil {
			return fmt.Errorf("lispdp: interface %s: %w", ifname, err)
		}
		if noTunnelGSO {
			// Run on this thread, in the datapath's namespace: the child
			// inherits it.
			out, err := exec.Command("ethtool", "-K", ifname, "tx-udp_tnl-segmentation", "off").CombinedOutput()
			if err != nil {
				return fmt.Errorf("lispdp: %s: turn tunnel segmentation off (ethtool): %v: %s", ifname, err, strings.TrimSpace(string(out)))
			}
		}
		for _, a := range as {
			if err := d.links.TCX(a.name, ifname, ifc.Attrs().Index, a.prog, a.at); err != nil {
				return fmt.Errorf("lispdp: %w", err)
			}
		}
		return nil
	})
}

// AttachRLOC attaches to an RLOC-facing (WAN) interface: decapsulation on
// its tcx ingress, encapsulation on its tcx egress (the node's own packets
// to EIDs, routed out of it: the gateway's subflows). Unless this kernel
// decapsulates superpackets (DecapsGSO), the interface is set to segment
// UDP tunnel superpackets itself before they leave (ethtool), since the
// far end, a kernel like this one, could not take them whole
// (docs/lisp-datapath.md, GSO).
func (d *Kernel) AttachRLOC(ifname string) error {
	return d.AttachRLOCWith(ifname, RLOCOptions{})
}

// AttachRLOCWith is AttachRLOC with options for the interface.
// WholeSuperpackets leaves the interface's tunnel segmentation alone: for
// an interface whose far end delivers what it decapsulates to its own
// sockets (an access gateway's subflows), which this datapath's lisp_decap
// takes whole even on a kernel without DecapsGSO.
func (d *Kernel) AttachRLOCWith(ifname string, o RLOCOptions) error {
	return d.attach(ifname, []attachment{
		{"decap/ingress/" + ifname, d.objs.LispDecap, ebpf.AttachTCXIngress},
		{"encap/egress/" + ifname, d.objs.LispEncap, ebpf.AttachTCXEgress},
	}, !d.gsoDecap && !o.WholeSuperpackets)
}

// AttachEID attaches encapsulation to the tcx ingress of an EID-facing
// interface: an xTR's packets from its site's EIDs arrive there.
func (d *Kernel) AttachEID(ifname string) error {
	return d.AttachEIDWith(ifname, EIDOptions{})
}

// AttachEIDWith is AttachEID with options for the interface.
// WholeSuperpackets records the namespace at the far end of the veth
// ifname (lisp_sites), whose own sockets take superpackets whole; the
// interface must be a veth into another namespace.
func (d *Kernel) AttachEIDWith(ifname string, o EIDOptions) error {
	if o.WholeSuperpackets {
		// Checked before anything is attached, so a refusal leaves nothing.
		var idx uint32
		var nsid int32
		if err := onehopns.DoPath(d.opts.Netns, func() error {
			l, err := netlink.LinkByName(ifname)
			if err != nil {
				return fmt.Errorf("lispdp: interface %s: %w", ifname, err)
			}
			if idx, nsid, err = siteEntry(l); err != nil {
				return fmt.Errorf("lispdp: %s: whole superpackets: %w", ifname, err)
			}
			return nil
		}); err != nil {
			return err
		}
		if err := d.objs.LispSites.Put(idx, nsid); err != nil {
			return fmt.Errorf("lispdp: %s: write lisp_sites: %w", ifname, err)
		}
	}
	return d.attach(ifname, []attachment{
		{"encap/ingress/" + ifname, d.objs.LispEncapIn, ebpf.AttachTCXIngress},
	}, false)
}

// siteEntry is l's lisp_sites entry: its ifindex and the netns id, in
// l's namespace, of the namespace its veth peer is in. A peer in the same
// namespace would be this node forwarding again, not a terminating end.
func siteEntry(l netlink.Link) (uint32, int32, error) {
	if l.Type() != "veth" {
		return 0, 0, fmt.Errorf("a %s, want a veth into the namespace that terminates the traffic", l.Type())
	}
	nsid := l.Attrs().NetNsID
	if nsid < 0 {
		return 0, 0, errors.New("its veth peer is in this namespace, want one in the namespace that terminates the traffic")
	}
	return uint32(l.Attrs().Index), int32(nsid), nil
}

// SetPath configures (or replaces) path id.
func (d *Kernel) SetPath(id uint8, p Path) error {
	e, err := pathEntry(p)
	if err != nil {
		return fmt.Errorf("lispdp: path %d: %w", id, err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	tk := lispLispTunnelKey{LocalRloc: e.LocalRloc, RemoteRloc: e.RemoteRloc}
	for other, o := range d.paths {
		if other != id && o.LocalRloc == tk.LocalRloc && o.RemoteRloc == tk.RemoteRloc {
			return fmt.Errorf("lispdp: path %d: %v -> %v is already path %d", id, p.LocalRLOC, p.RemoteRLOC, other)
		}
	}
	if old, ok := d.paths[id]; ok {
		if err := d.forgetTunnel(id, old); err != nil {
			return err
		}
	}
	if err := d.objs.LispPaths.Put(uint32(id), e); err != nil {
		return fmt.Errorf("lispdp: write path %d: %w", id, err)
	}
	if err := d.objs.LispTunnels.Put(tk, uint32(id)); err != nil {
		return fmt.Errorf("lispdp: write tunnel of path %d: %w", id, err)
	}
	if err := d.objs.LispLocals.Put(e.LocalRloc, uint32(1)); err != nil {
		return fmt.Errorf("lispdp: write local RLOC of path %d: %w", id, err)
	}
	d.paths[id] = e
	return nil
}

// forgetTunnel removes what decapsulation knows of path id (old), keeping
// its local RLOC while another path still uses it.
func (d *Kernel) forgetTunnel(id uint8, old lispLispPath) error {
	tk := lispLispTunnelKey{LocalRloc: old.LocalRloc, RemoteRloc: old.RemoteRloc}
	if err := d.objs.LispTunnels.Delete(tk); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("lispdp: delete tunnel of path %d: %w", id, err)
	}
	for other, o := range d.paths {
		if other != id && o.LocalRloc == old.LocalRloc {
			return nil
		}
	}
	if err := d.objs.LispLocals.Delete(old.LocalRloc); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("lispdp: delete local RLOC of path %d: %w", id, err)
	}
	return nil
}

// DeletePath removes path id: encapsulation onto it stops (no_path) and its
// remote RLOC is no longer accepted.
func (d *Kernel) DeletePath(id uint8) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	old, ok := d.paths[id]
	if !ok {
		return nil
	}
	if err := d.objs.LispPaths.Put(uint32(id), lispLispPath{}); err != nil {
		return fmt.Errorf("lispdp: clear path %d: %w", id, err)
	}
	if err := d.forgetTunnel(id, old); err != nil {
		return err
	}
	delete(d.paths, id)
	return nil
}

// SetEID maps an EID prefix to its RLOCs (as paths), at most Slots of
// them. An empty paths is a negative mapping: packets to the prefix go on
// natively, untouched. Decapsulation takes a packet from the prefix only
// from the remote RLOC of one of the paths listed.
func (d *Kernel) SetEID(prefix netip.Prefix, paths []PathChoice) error {
	k, err := eidKey(prefix)
	if err != nil {
		return fmt.Errorf("lispdp: %w", err)
	}
	e, err := eidEntry(paths)
	if err != nil {
		return fmt.Errorf("lispdp: EID %v: %w", prefix, err)
	}
	if err := d.objs.LispEids.Put(k, e); err != nil {
		return fmt.Errorf("lispdp: write EID %v: %w", prefix, err)
	}
	return nil
}

// DeleteEID forgets an EID prefix's mapping.
func (d *Kernel) DeleteEID(prefix netip.Prefix) error {
	k, err := eidKey(prefix)
	if err != nil {
		return fmt.Errorf("lispdp: %w", err)
	}
	if err := d.objs.LispEids.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("lispdp: delete EID %v: %w", prefix, err)
	}
	return nil
}

// PinSource makes packets from innerSrc take path id whenever their
// destination's mapping lists it as usable (one subflow, one path).
func (d *Kernel) PinSource(innerSrc netip.Addr, id uint8) error {
	if !innerSrc.Is4() {
		return fmt.Errorf("lispdp: pin %v: not IPv4", innerSrc)
	}
	if err := d.objs.LispPins.Put(be32(innerSrc), uint32(id)); err != nil {
		return fmt.Errorf("lispdp: pin %v to path %d: %w", innerSrc, id, err)
	}
	return nil
}

// Unpin removes innerSrc's pin.
func (d *Kernel) Unpin(innerSrc netip.Addr) error {
	if !innerSrc.Is4() {
		return fmt.Errorf("lispdp: unpin %v: not IPv4", innerSrc)
	}
	if err := d.objs.LispPins.Delete(be32(innerSrc)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("lispdp: unpin %v: %w", innerSrc, err)
	}
	return nil
}

// PathStats returns the counts of every configured path.
func (d *Kernel) PathStats() (map[uint8]Stats, error) {
	d.mu.Lock()
	ids := make([]uint8, 0, len(d.paths))
	for id := range d.paths {
		ids = append(ids, id)
	}
	d.mu.Unlock()
	out := map[uint8]Stats{}
	for _, id := range ids {
		var per []lispLispStats
		if err := d.objs.LispPathStats.Lookup(uint32(id), &per); err != nil {
			return nil, fmt.Errorf("lispdp: read stats of path %d: %w", id, err)
		}
		var s Stats
		for _, c := range per {
			s.TxPackets += c.TxPackets
			s.TxBytes += c.TxBytes
			s.RxPackets += c.RxPackets
			s.RxBytes += c.RxBytes
		}
		out[id] = s
	}
	return out, nil
}

// Counters returns every datapath counter by name (encapsulated, pinned,
// decapsulated, native, drop_*), summed over CPUs.
func (d *Kernel) Counters() (map[string]uint64, error) {
	out, err := bpfobj.Counters(d.objs.LispCounters, d.counterNames)
	if err != nil {
		return nil, fmt.Errorf("lispdp: %w", err)
	}
	return out, nil
}

// Drops returns the drop counters by reason (malformed, unknown_rloc,
// wrong_iid, no_path, too_big, ...), summed over CPUs.
func (d *Kernel) Drops() (map[string]uint64, error) {
	all, err := d.Counters()
	if err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	for name, v := range all {
		if r, ok := strings.CutPrefix(name, "drop_"); ok {
			out[r] = v
		}
	}
	return out, nil
}
