package gateway

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"

	"github.com/vishvananda/netlink"

	"github.com/onehop/onehop/internal/lispdp"
)

// lispOverhead is what LISP encapsulation adds (outer IPv4, UDP, LISP).
const lispOverhead = lispdp.Overhead

// LISPDatapath is the part of the in-kernel LISP datapath
// (*lispdp.Kernel) the gateway drives.
type LISPDatapath interface {
	SetPath(id uint8, p lispdp.Path) error
	SetEID(prefix netip.Prefix, paths []lispdp.PathChoice) error
	PinSource(innerSrc netip.Addr, id uint8) error
	PathStats() (map[uint8]lispdp.Stats, error)
}

// LISPPinner pins subflows with LISP: a datapath path (tunnel) per pair of
// gateway path and remote RLOC, the destination prefix mapped to the
// tunnels of its locators, and each path's EID pinned to its tunnel, so
// the subflow from e_i is encapsulated from path i's RLOC to its locator.
// The source rules and tables of Routes still pick each subflow's
// interface (and lower its route MTU by the encapsulation's 36 bytes).
type LISPPinner struct {
	cfg    *Config
	routes *Routes
	dp     LISPDatapath

	mu   sync.Mutex
	ids  map[tunnel]uint8
	path map[uint8]int // tunnel id -> gateway path
	eids map[netip.Prefix]map[netip.Addr]lispdp.PathChoice
}

type tunnel struct {
	path   int
	remote netip.Addr
}

// NewLISPPinner returns a pinner over dp; routes pick the interfaces.
func NewLISPPinner(cfg *Config, routes *Routes, dp LISPDatapath) *LISPPinner {
	return &LISPPinner{cfg: cfg, routes: routes, dp: dp, ids: map[tunnel]uint8{}, path: map[uint8]int{},
		eids: map[netip.Prefix]map[netip.Addr]lispdp.PathChoice{}}
}

// Pin implements Pinner.
func (l *LISPPinner) Pin(path int, rec Record, loc netip.Addr) error {
	p := l.cfg.Paths[path]
	link, err := netlink.LinkByName(p.Dev)
	if err != nil {
		return fmt.Errorf("lisp pin over %s: %w", p.Name, err)
	}
	var prio, weight uint8 = 1, 1
	for _, lc := range rec.Locators {
		if lc.Addr == loc {
			prio, weight = lc.Priority, lc.Weight
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	k := tunnel{path, loc}
	id, ok := l.ids[k]
	if !ok {
		if len(l.ids) >= lispdp.MaxPaths-1 {
			return fmt.Errorf("lisp pin over %s to %s: all %d tunnels in use", p.Name, loc, lispdp.MaxPaths-1)
		}
		id = uint8(len(l.ids) + 1)
	}
	if err := l.dp.SetPath(id, lispdp.Path{Ifindex: link.Attrs().Index, LocalRLOC: p.RLOC, RemoteRLOC: loc, MTU: link.Attrs().MTU}); err != nil {
		return err
	}
	l.ids[k], l.path[id] = id, path
	m := l.eids[rec.EID]
	if m == nil {
		m = map[netip.Addr]lispdp.PathChoice{}
		l.eids[rec.EID] = m
	}
	m[loc] = lispdp.PathChoice{ID: id, Priority: prio, Weight: weight}
	choices := make([]lispdp.PathChoice, 0, len(m))
	for _, c := range m {
		choices = append(choices, c)
	}
	if err := l.dp.SetEID(rec.EID, choices); err != nil {
		return err
	}
	/* one pin per EID: with several data centers, a subflow to a
	   destination whose mapping does not list this tunnel is hashed
	   among its own RLOCs instead (docs/lisp-datapath.md) */
	if err := l.dp.PinSource(p.EID, id); err != nil {
		return err
	}
	return l.routes.PinPrefix(path, rec.EID, loc)
}

// Repin implements Pinner: the datapath's maps outlive a link going down;
// the routes do not.
func (l *LISPPinner) Repin(path int) error { return l.routes.Repin(path) }

// Close implements Pinner (the datapath is closed by its owner).
func (l *LISPPinner) Close() error { return nil }

// PathBytes implements PathCounter: the datapath's per-tunnel counters,
// summed per gateway path.
func (l *LISPPinner) PathBytes() (map[int]PathBytes, error) {
	st, err := l.dp.PathStats()
	if err != nil {
		return nil, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[int]PathBytes{}
	for i := range l.cfg.Paths {
		out[i] = PathBytes{}
	}
	for id, s := range st {
		p, ok := l.path[id]
		if !ok {
			continue
		}
		b := out[p]
		b.TxBytes += s.TxBytes
		b.TxPackets += s.TxPackets
		b.RxBytes += s.RxBytes
		b.RxPackets += s.RxPackets
		out[p] = b
	}
	return out, nil
}

// openLISP loads the datapath and attaches it to every path's interface.
func openLISP(cfg *Config) (*lispdp.Kernel, error) {
	dp, err := lispdp.Open(lispdp.Options{})
	if err != nil {
		return nil, fmt.Errorf("--lisp: %w", err)
	}
	for _, p := range cfg.Paths {
		if err := dp.AttachRLOCWith(p.Dev, lispdp.RLOCOptions{WholeSuperpackets: cfg.WholeSuperpackets}); err != nil {
			return nil, errors.Join(fmt.Errorf("--lisp: --path dev=%s: %w", p.Dev, err), dp.Close())
		}
	}
	return dp, nil
}
