package lispdp

import (
	"errors"
	"net/netip"
)

// errTODO marks what is not built yet.
var errTODO = errors.New("lispdp: not implemented yet")

// Datapath is the LISP data plane loaded into the kernel: the programs, their
// maps and the links attaching them.
type Datapath struct{}

// Open loads the programs and maps; nothing is attached yet.
func Open(o Options) (*Datapath, error) { return nil, errTODO }

// Close detaches every link and unloads the programs.
func (d *Datapath) Close() error { return errTODO }

// AttachRLOC attaches to an RLOC-facing (WAN) interface: decapsulation on
// its tcx ingress, encapsulation on its tcx egress (the node's own packets
// to EIDs, routed out of it: the gateway's subflows).
func (d *Datapath) AttachRLOC(ifname string) error { return errTODO }

// AttachEID attaches encapsulation to the tcx ingress of an EID-facing
// interface: an xTR's packets from its site's EIDs arrive there.
func (d *Datapath) AttachEID(ifname string) error { return errTODO }

// SetPath configures (or replaces) path id.
func (d *Datapath) SetPath(id uint8, p Path) error { return errTODO }

// DeletePath removes path id: encapsulation onto it stops (no_path) and its
// remote RLOC is no longer accepted.
func (d *Datapath) DeletePath(id uint8) error { return errTODO }

// SetEID maps an EID prefix to its RLOCs (as paths). An empty paths is a
// negative mapping: packets to the prefix go on natively, untouched.
func (d *Datapath) SetEID(prefix netip.Prefix, paths []PathChoice) error { return errTODO }

// DeleteEID forgets an EID prefix's mapping.
func (d *Datapath) DeleteEID(prefix netip.Prefix) error { return errTODO }

// PinSource makes packets from innerSrc take path id whenever their
// destination's mapping lists it as usable (one subflow, one path).
func (d *Datapath) PinSource(innerSrc netip.Addr, id uint8) error { return errTODO }

// Unpin removes innerSrc's pin.
func (d *Datapath) Unpin(innerSrc netip.Addr) error { return errTODO }

// PathStats returns the counts of every configured path.
func (d *Datapath) PathStats() (map[uint8]Stats, error) { return nil, errTODO }

// Counters returns every datapath counter by name (encapsulated,
// decapsulated, native, drop_*), summed over CPUs.
func (d *Datapath) Counters() (map[string]uint64, error) { return nil, errTODO }

// Drops returns the drop counters by reason (malformed, unknown_rloc,
// wrong_iid, no_path, too_big, ...), summed over CPUs.
func (d *Datapath) Drops() (map[string]uint64, error) { return nil, errTODO }
