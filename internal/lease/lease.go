// Package lease reads, writes and checks port leases (port-space
// isolation): "[UPLINK:]LO-HI[,...]" lists, the rules one sliver's leases
// follow, and overlaps with other slivers' leases and the host's own
// ephemeral range. Pure: the topology file, the controller and the CLI
// share it.
package lease

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/limits"
)

// The host's own ephemeral range when its agent has not reported one:
// Linux's default net.ipv4.ip_local_port_range.
const (
	DefaultEphemeralLo = 32768
	DefaultEphemeralHi = 60999
)

// MaxUplinks is how many uplinks one host may lease ports on (the
// datapath's limit).
const MaxUplinks = limits.MaxUplinks

// MaxLeases is how many ranges one sliver may lease: enough for a few
// services per uplink, small enough that a list stays readable.
const MaxLeases = 16

// sliverNameRE: a sliver's name becomes part of its host-side interface
// name (s<k>-NAME, intent.SliverIfname), which Linux caps at 15 bytes.
var sliverNameRE = regexp.MustCompile(`^[a-z][a-z0-9]{0,11}$`)

// CheckSliverName applies the naming rule of slivers: 1-12 lowercase letters or
// digits, starting with a letter (like hosts).
func CheckSliverName(name string) error {
	if !sliverNameRE.MatchString(name) {
		return fmt.Errorf("sliver name %q must be 1-12 lowercase letters or digits, starting with a letter", name)
	}
	return nil
}

// Parse reads a lease list, "[UPLINK:]LO-HI[,...]": "10000-10099",
// "10000-10099,1:20000-20099", "10022" (one port, LO=HI). A range without
// an uplink is on uplink 0. The result is checked (Check) and in
// canonical order (by uplink, then port).
func Parse(s string) ([]intent.Lease, error) {
	if strings.TrimSpace(s) == "" {
		return nil, fmt.Errorf("empty lease list: want [UPLINK:]LO-HI[,...], e.g. 10000-10099")
	}
	var out []intent.Lease
	for i, part := range strings.Split(s, ",") {
		l, err := parseLease(strings.TrimSpace(part))
		if err != nil {
			return nil, fmt.Errorf("lease %d %q: %w", i+1, strings.TrimSpace(part), err)
		}
		out = append(out, l)
	}
	Sort(out)
	if err := Check(out); err != nil {
		return nil, err
	}
	return out, nil
}

func parseLease(s string) (intent.Lease, error) {
	var l intent.Lease
	if s == "" {
		return l, fmt.Errorf("empty range: want [UPLINK:]LO-HI")
	}
	if up, rest, ok := strings.Cut(s, ":"); ok {
		n, err := strconv.Atoi(up)
		if err != nil || n < 0 || n >= MaxUplinks {
			return l, fmt.Errorf("uplink %q: want a number 0..%d", up, MaxUplinks-1)
		}
		l.Uplink, s = n, rest
	}
	lo, hi, isRange := strings.Cut(s, "-")
	var err error
	if l.Lo, err = parsePort(lo); err != nil {
		return l, err
	}
	l.Hi = l.Lo
	if isRange {
		if l.Hi, err = parsePort(hi); err != nil {
			return l, err
		}
	}
	if l.Lo > l.Hi {
		return l, fmt.Errorf("range %d-%d runs backwards: want LO <= HI", l.Lo, l.Hi)
	}
	return l, nil
}

func parsePort(s string) (uint16, error) {
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil || n < 1 || n > 65535 {
		return 0, fmt.Errorf("port %q: want a number 1..65535", s)
	}
	return uint16(n), nil
}

// Sort puts leases in canonical order: by uplink, then by first port.
func Sort(ls []intent.Lease) {
	slices.SortFunc(ls, func(a, b intent.Lease) int {
		if a.Uplink != b.Uplink {
			return a.Uplink - b.Uplink
		}
		return int(a.Lo) - int(b.Lo)
	})
}

// Check validates one sliver's leases, whatever their order: at
// least one, at most MaxLeases, 1 <= lo <= hi <= 65535, uplink
// 0..MaxUplinks-1, no two overlapping.
func Check(ls []intent.Lease) error {
	if len(ls) == 0 {
		return fmt.Errorf("no leases: a sliver leases at least one port range")
	}
	if len(ls) > MaxLeases {
		return fmt.Errorf("%d leases: a sliver may hold at most %d ranges", len(ls), MaxLeases)
	}
	for _, l := range ls {
		if l.Uplink < 0 || l.Uplink >= MaxUplinks {
			return fmt.Errorf("lease %s: uplink %d: want 0..%d", FormatOne(l), l.Uplink, MaxUplinks-1)
		}
		if l.Lo < 1 || l.Lo > l.Hi {
			return fmt.Errorf("lease %s: want 1 <= LO <= HI <= 65535", FormatOne(l))
		}
	}
	for i, a := range ls {
		for _, b := range ls[i+1:] {
			if lo, hi, ok := intersect(a, b); ok {
				return fmt.Errorf("leases %s and %s overlap on ports %s", FormatOne(a), FormatOne(b), portRange(lo, hi))
			}
		}
	}
	return nil
}

// OverlapError is a lease that takes ports someone else holds on the same
// host: another sliver, or the host itself (its ephemeral range, Holder
// "").
type OverlapError struct {
	Host string
	// Ports are the contested ports, on Uplink.
	Uplink int
	Lo, Hi uint16
	// Holder is the other sliver (HOST/NAME), "" for the host's own
	// ephemeral range; Theirs is its lease (or the range).
	Holder string
	Theirs intent.Lease
}

func (e *OverlapError) Error() string {
	if e.Holder == "" {
		return fmt.Sprintf("ports %s on uplink %d overlap host %s's ephemeral range %s (its net.ipv4.ip_local_port_range, which its own connections use)",
			portRange(e.Lo, e.Hi), e.Uplink, e.Host, portRange(e.Theirs.Lo, e.Theirs.Hi))
	}
	return fmt.Sprintf("ports %s on uplink %d overlap %s's lease %s", portRange(e.Lo, e.Hi), e.Uplink, e.Holder, portRange(e.Theirs.Lo, e.Theirs.Hi))
}

// Ephemeral is the host's own ephemeral range from its node record, or
// Linux's default where the agent reported none (0/0).
func Ephemeral(n intent.Node) (lo, hi uint16) {
	if n.EphemeralLo == 0 && n.EphemeralHi == 0 {
		return DefaultEphemeralLo, DefaultEphemeralHi
	}
	return n.EphemeralLo, n.EphemeralHi
}

// Overlap checks ls, the leases of sliver name on host, against the other
// slivers of that host (a sliver of that name among them is skipped: it is
// the one being replaced) and against the host's ephemeral range, which
// no uplink's lease may touch. It returns the first *OverlapError, in a
// deterministic order (the lease's order, then the other's name).
func Overlap(host, name string, ls []intent.Lease, others []intent.Sliver, ephLo, ephHi uint16) error {
	others = slices.Clone(others)
	slices.SortFunc(others, func(a, b intent.Sliver) int { return strings.Compare(a.Name, b.Name) })
	for _, l := range ls {
		if lo, hi, ok := intersect(l, intent.Lease{Uplink: l.Uplink, Lo: ephLo, Hi: ephHi}); ok && ephLo <= ephHi {
			return &OverlapError{Host: host, Uplink: l.Uplink, Lo: lo, Hi: hi, Theirs: intent.Lease{Uplink: l.Uplink, Lo: ephLo, Hi: ephHi}}
		}
		for _, o := range others {
			if o.Host != host || o.Name == name {
				continue
			}
			for _, t := range o.Leases {
				if lo, hi, ok := intersect(l, t); ok {
					return &OverlapError{Host: host, Uplink: l.Uplink, Lo: lo, Hi: hi, Holder: o.FullName(), Theirs: t}
				}
			}
		}
	}
	return nil
}

// intersect returns the ports a and b share, if they are on one uplink.
func intersect(a, b intent.Lease) (lo, hi uint16, ok bool) {
	if a.Uplink != b.Uplink {
		return 0, 0, false
	}
	lo, hi = max(a.Lo, b.Lo), min(a.Hi, b.Hi)
	return lo, hi, lo <= hi
}

// Format writes leases back in the form Parse reads, in the
// order given: "10000-10099,1:20000-20099".
func Format(ls []intent.Lease) string {
	parts := make([]string, len(ls))
	for i, l := range ls {
		parts[i] = FormatOne(l)
	}
	return strings.Join(parts, ",")
}

// FormatOne writes one lease: "10000-10099", "1:20000-20099", "10022".
func FormatOne(l intent.Lease) string {
	s := portRange(l.Lo, l.Hi)
	if l.Uplink != 0 {
		s = strconv.Itoa(l.Uplink) + ":" + s
	}
	return s
}

func portRange(lo, hi uint16) string {
	if lo == hi {
		return strconv.Itoa(int(lo))
	}
	return strconv.Itoa(int(lo)) + "-" + strconv.Itoa(int(hi))
}

// Lowest port a slice of a host's address may start at: below it are the
// well-known ports, the host's own services.
const SliceFloor = 1024

// FreeSlice finds size ports on uplink that nobody holds: none of taken
// (slivers' leases, other VMs' slices, published ports: one lease space
// per uplink address) and not the host's ephemeral range [ephLo, ephHi].
// The lowest free range at or above SliceFloor, so slices pack from the
// bottom and a freed one is the next taken.
func FreeSlice(uplink int, size uint16, taken []intent.Lease, ephLo, ephHi uint16) (intent.Lease, error) {
	if size == 0 {
		return intent.Lease{}, fmt.Errorf("slice of 0 ports: want at least 1")
	}
	held := []intent.Lease{}
	for _, t := range taken {
		if t.Uplink == uplink {
			held = append(held, t)
		}
	}
	if ephLo <= ephHi {
		held = append(held, intent.Lease{Uplink: uplink, Lo: ephLo, Hi: ephHi})
	}
	Sort(held)
	lo := uint32(SliceFloor)
	for _, h := range held {
		if uint32(h.Lo) > lo && uint32(h.Lo)-lo >= uint32(size) {
			break
		}
		if uint32(h.Hi)+1 > lo {
			lo = uint32(h.Hi) + 1
		}
	}
	if lo+uint32(size)-1 > 65535 {
		return intent.Lease{}, fmt.Errorf("no %d free ports on uplink %d: slivers' leases, other slices and the ephemeral range %d-%d hold the rest", size, uplink, ephLo, ephHi)
	}
	return intent.Lease{Uplink: uplink, Lo: uint16(lo), Hi: uint16(lo + uint32(size) - 1)}, nil
}
