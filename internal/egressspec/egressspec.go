// Package egressspec is the rules of a farm's egress setting
// (docs/north-south.md): destinations, slice sizes and their bounds. Pure,
// shared by the controller, the CLI and the topology file; internal/egress
// is the datapath feature.
package egressspec

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/onehop/onehop/internal/intent"
)

// Slice sizes: each egress VM holds this many ports (and ICMP echo ids)
// of its host's address, one flow per port at a time.
const (
	// DefaultSlice is the slice a farm gets when it names none: 256
	// concurrent flows per VM, and ~120 egress VMs in the ports of one
	// address outside the host's ephemeral range.
	DefaultSlice = 256
	// MinSlice and MaxSlice bound what a farm's owner may ask for: a slice
	// takes ports from every other VM on the host, so no tenant may take
	// an address's ports by itself (docs/north-south.md, sizing).
	MinSlice = 16
	MaxSlice = 4096
	// MaxTo is how many destination prefixes one farm may list.
	MaxTo = 16
)

// ParseTo reads "CIDR,CIDR,...": IPv4 prefixes, each in canonical form
// (no host bits). "" is anywhere (0.0.0.0/0).
func ParseTo(s string) ([]string, error) {
	if strings.TrimSpace(s) == "" {
		return []string{"0.0.0.0/0"}, nil
	}
	return CheckTo(strings.Split(s, ","))
}

// CheckTo checks a destination list and returns it trimmed; empty is
// anywhere.
func CheckTo(list []string) ([]string, error) {
	if len(list) == 0 {
		return []string{"0.0.0.0/0"}, nil
	}
	if len(list) > MaxTo {
		return nil, fmt.Errorf("%d destinations: a farm may list at most %d prefixes", len(list), MaxTo)
	}
	out := make([]string, 0, len(list))
	for i, c := range list {
		c = strings.TrimSpace(c)
		p, err := netip.ParsePrefix(c)
		if err != nil || !p.Addr().Is4() {
			return nil, fmt.Errorf("destination %d %q: want an IPv4 prefix such as 192.0.2.0/24 or 0.0.0.0/0", i+1, c)
		}
		if p.Masked() != p {
			return nil, fmt.Errorf("destination %d %q has host bits set: did you mean %s?", i+1, c, p.Masked())
		}
		out = append(out, p.String())
	}
	return out, nil
}

// CheckSlice checks a slice size (0: DefaultSlice) and returns it.
func CheckSlice(n int) (uint16, error) {
	if n == 0 {
		return DefaultSlice, nil
	}
	if n < MinSlice || n > MaxSlice {
		return 0, fmt.Errorf("slice of %d ports: want %d..%d (the default is %d)", n, MinSlice, MaxSlice, DefaultSlice)
	}
	return uint16(n), nil
}

// Setting is a farm's egress setting as the CLI and API give it; Farm
// checks it into the record.
type Setting struct {
	Enabled bool     `json:"enabled"`
	To      []string `json:"to,omitempty"`
	Slice   int      `json:"slice,omitempty"`
}

// Farm checks s and returns the farm's record for it (nil: off).
func Farm(s Setting) (*intent.FarmEgress, error) {
	if !s.Enabled {
		if len(s.To) > 0 || s.Slice != 0 {
			return nil, fmt.Errorf("destinations or a slice size given with egress off: pass --egress to turn it on")
		}
		return nil, nil
	}
	to, err := CheckTo(s.To)
	if err != nil {
		return nil, err
	}
	size, err := CheckSlice(s.Slice)
	if err != nil {
		return nil, err
	}
	return &intent.FarmEgress{To: to, Slice: size}, nil
}

// Subnet checks s as a subnet's own setting, which overrides its farm's:
// off there, or on with its own destinations and slice size.
func Subnet(s Setting) (*intent.SubnetEgress, error) {
	eg, err := Farm(s)
	if err != nil {
		return nil, err
	}
	if eg == nil {
		return &intent.SubnetEgress{Off: true}, nil
	}
	return &intent.SubnetEgress{To: eg.To, Slice: eg.Slice}, nil
}
