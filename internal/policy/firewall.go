package policy

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/limits"
)

// MaxFirewallRules is how many rules a VM's firewall holds per direction
// (FW_MAX_RULES in bpf/lib/common.h: the datapath walks them in a bounded loop).
const MaxFirewallRules = limits.MaxFirewallRules

// ParsePorts reads "22" or "8000-8080"; "" is any port (0, 0).
func ParsePorts(s string) (lo, hi uint16, err error) {
	if s == "" {
		return 0, 0, nil
	}
	a, b, isRange := strings.Cut(s, "-")
	l, err1 := strconv.ParseUint(a, 10, 16)
	h := l
	var err2 error
	if isRange {
		h, err2 = strconv.ParseUint(b, 10, 16)
	}
	if err1 != nil || err2 != nil || l == 0 || h < l {
		return 0, 0, fmt.Errorf("ports %q: want a port (1-65535) or a range lo-hi", s)
	}
	return uint16(l), uint16(h), nil
}

// CheckFirewall reports the first mistake in fw, naming the rule.
func CheckFirewall(fw *intent.Firewall) error {
	if fw == nil {
		return nil
	}
	for name, d := range map[string]string{"default_in": fw.DefaultIn, "default_out": fw.DefaultOut} {
		if d != "allow" && d != "deny" {
			return fmt.Errorf("firewall %s %q: want allow or deny", name, d)
		}
	}
	count := map[string]int{}
	for i, r := range fw.Rules {
		where := fmt.Sprintf("firewall rule %d", i+1)
		if r.Dir != "in" && r.Dir != "out" {
			return fmt.Errorf("%s: dir %q: want in or out", where, r.Dir)
		}
		if r.Action != "allow" && r.Action != "deny" {
			return fmt.Errorf("%s: action %q: want allow or deny", where, r.Action)
		}
		p, err := ProtoNumber(r.Proto)
		if err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
		if r.PortLo != 0 && p != 6 && p != 17 {
			return fmt.Errorf("%s: ports need proto tcp or udp", where)
		}
		if r.CIDR != "" {
			pf, err := netip.ParsePrefix(r.CIDR)
			if err != nil || !pf.Addr().Is4() {
				return fmt.Errorf("%s: cidr %q is not an IPv4 prefix", where, r.CIDR)
			}
		}
		count[r.Dir]++
		if count[r.Dir] > MaxFirewallRules {
			return fmt.Errorf("%s: more than %d rules in one direction", where, MaxFirewallRules)
		}
	}
	return nil
}
