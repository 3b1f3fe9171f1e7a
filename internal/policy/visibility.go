package policy

import (
	"fmt"
	"sort"
	"strings"

	"github.com/onehop/onehop/internal/filter"
	"github.com/onehop/onehop/internal/intent"
)

// ProtoNumber maps a rule's protocol name to its IP protocol number; "" and
// "any" are 0, the wildcard (filter.ProtoNumber, shared with TAP policies).
func ProtoNumber(name string) (uint8, error) { return filter.ProtoNumber(name) }

// Visibility compiles the farms' rules into what the datapath enforces
// (paper §2): a rule between two subnets of one farm stands as its owner
// wrote it; a rule across farms counts only if both farms peer with each
// other and both allow it, and then only the part both allow.
func Visibility(farms []intent.Farm, subnets []intent.Subnet) []intent.VisRule {
	type ids struct{ farm, subnet uint16 }
	subnetIDs := map[string]ids{}
	farmIDs := map[string]uint16{}
	for _, f := range farms {
		farmIDs[f.Name] = f.ID
	}
	for _, s := range subnets {
		subnetIDs[s.Farm+"/"+s.Name] = ids{farmIDs[s.Farm], s.ID}
	}
	byName := map[string]intent.Farm{}
	for _, f := range farms {
		byName[f.Name] = f
	}
	peers := func(a, b string) bool {
		for _, p := range byName[a].Peers {
			if p == b {
				return true
			}
		}
		return false
	}
	farmOf := func(subnet string) string { f, _, _ := strings.Cut(subnet, "/"); return f }

	seen := map[intent.VisRule]bool{}
	var out []intent.VisRule
	emit := func(from, to string, proto uint8, port uint16) {
		src, ok1 := subnetIDs[from]
		dst, ok2 := subnetIDs[to]
		if !ok1 || !ok2 || from == to {
			return
		}
		r := intent.VisRule{SrcFarm: src.farm, SrcSubnet: src.subnet, DstFarm: dst.farm, DstSubnet: dst.subnet, Proto: proto, Port: port}
		if !seen[r] {
			seen[r] = true
			out = append(out, r)
		}
	}
	for _, f := range farms {
		for _, r := range f.Rules {
			proto, err := ProtoNumber(r.Proto)
			if err != nil {
				continue // validated when the rule was written
			}
			ff, tf := farmOf(r.From), farmOf(r.To)
			if ff == f.Name && tf == f.Name {
				emit(r.From, r.To, proto, r.Port)
				continue
			}
			other := ff
			if other == f.Name {
				other = tf
			}
			// Emitted once, from the farm that sorts first, if both agree.
			if f.Name > other || !peers(f.Name, other) || !peers(other, f.Name) {
				continue
			}
			for _, r2 := range byName[other].Rules {
				if r2.From != r.From || r2.To != r.To {
					continue
				}
				p2, err := ProtoNumber(r2.Proto)
				if err != nil {
					continue
				}
				if p, ok := intersect(proto, p2); ok {
					if port, ok := intersect(r.Port, r2.Port); ok {
						emit(r.From, r.To, p, port)
					}
				}
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return fmt.Sprint(out[i]) < fmt.Sprint(out[j]) })
	return out
}

// intersect of two values where 0 means any.
func intersect[T uint8 | uint16](a, b T) (T, bool) {
	switch {
	case a == 0:
		return b, true
	case b == 0 || a == b:
		return a, true
	}
	return 0, false
}
