package policy

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/onehop/onehop/internal/filter"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/limits"
)

// MaxFirewallRules is how many rules a VM's firewall holds per direction
// (FW_MAX_RULES in bpf/lib/common.h: the datapath walks them in a bounded loop).
const MaxFirewallRules = limits.MaxFirewallRules

// FieldError says which field of a rule a check rejected: Field is its JSON
// name (portLo, dir, ...), so the API can name it and the CLI can map it to
// its flag; Msg names the field and the value, e.g. `dir "up": want in or
// out`. One type for every kind of rule (filter.FieldError).
type FieldError = filter.FieldError

var fieldErr = filter.Errorf

// ParsePorts reads "22" or "8000-8080"; "" is any port (0, 0). A single port
// comes back as the range lo..lo. The one parser of port filters
// (filter.ParsePorts), shared with TAP policies.
func ParsePorts(s string) (lo, hi uint16, err error) { return filter.ParsePorts(s) }

// CheckPorts is the one rule for a stored port range (portLo, portHi): both 0
// is any port, otherwise 1 <= portLo <= portHi. The datapath matches
// portLo..portHi when portLo is set and ignores portHi when it is not, so any
// other pair would silently mean something else (never match, or every port).
func CheckPorts(lo, hi uint16) error {
	switch {
	case lo == 0 && hi != 0:
		return fieldErr("portLo", "portHi %d without portLo: give portLo alone for one port, or portLo and portHi for a range", hi)
	case lo != 0 && hi == 0:
		return fieldErr("portHi", "portLo %d without portHi: one port is portLo=portHi", lo)
	case lo > hi:
		return fieldErr("portHi", "portHi %d is below portLo %d: want portLo <= portHi", hi, lo)
	}
	return nil
}

// NormalizePorts turns what a client may send into a stored range: portLo
// alone is the one port portLo..portLo; then CheckPorts applies.
func NormalizePorts(lo, hi uint16) (uint16, uint16, error) {
	if lo != 0 && hi == 0 {
		hi = lo
	}
	return lo, hi, CheckPorts(lo, hi)
}

// NormalizeProto returns a protocol name in its stored form: lowercase, and
// "" for any (so "TCP" and "tcp", "any" and "" are the same rule).
func NormalizeProto(name string) (string, error) {
	if _, err := ProtoNumber(name); err != nil {
		return "", fieldErr("proto", "%v", err)
	}
	p := strings.ToLower(name)
	if p == "any" {
		p = ""
	}
	return p, nil
}

// NormalizeAction returns "allow" or "deny" from any case of them; field
// names the input (action, defaultIn, ...). "" stays "" when empty is true:
// a default left unchanged.
func NormalizeAction(field, s string, empty bool) (string, error) {
	a := strings.ToLower(s)
	if a == "allow" || a == "deny" || (a == "" && empty) {
		return a, nil
	}
	return "", fieldErr(field, "%s %q: want allow or deny", field, s)
}

// NormalizeFirewallRule is the one check of a firewall rule a client sends
// (the CLI before sending it, the controller when it arrives): enum fields
// in lowercase, proto "" for any, portLo alone as the one port portLo, the
// CIDR masked. It returns the rule in the form it is stored and compared in,
// or a *FieldError naming the field that is wrong.
func NormalizeFirewallRule(r intent.FirewallRule) (intent.FirewallRule, error) {
	var err error
	if r.Dir = strings.ToLower(r.Dir); r.Dir != "in" && r.Dir != "out" {
		return r, fieldErr("dir", "dir %q: want in or out", r.Dir)
	}
	if r.Action, err = NormalizeAction("action", r.Action, false); err != nil {
		return r, err
	}
	if r.Proto, err = NormalizeProto(r.Proto); err != nil {
		return r, err
	}
	if r.PortLo, r.PortHi, err = NormalizePorts(r.PortLo, r.PortHi); err != nil {
		return r, err
	}
	if r.CIDR != "" {
		pf, err := netip.ParsePrefix(r.CIDR)
		if err != nil || !pf.Addr().Is4() {
			return r, fieldErr("cidr", "cidr %q is not an IPv4 prefix like 10.1.2.0/24", r.CIDR)
		}
		r.CIDR = pf.Masked().String()
	}
	return r, checkFirewallRule(r)
}

// checkFirewallRule checks a rule in its stored form.
func checkFirewallRule(r intent.FirewallRule) error {
	if r.Dir != "in" && r.Dir != "out" {
		return fieldErr("dir", "dir %q: want in or out", r.Dir)
	}
	if r.Action != "allow" && r.Action != "deny" {
		return fieldErr("action", "action %q: want allow or deny", r.Action)
	}
	p, err := ProtoNumber(r.Proto)
	if err != nil {
		return fieldErr("proto", "%v", err)
	}
	if err := CheckPorts(r.PortLo, r.PortHi); err != nil {
		return err
	}
	if r.PortLo != 0 && p != 6 && p != 17 {
		return fieldErr("portLo", "ports need proto tcp or udp, not %q", r.Proto)
	}
	if r.CIDR != "" {
		pf, err := netip.ParsePrefix(r.CIDR)
		if err != nil || !pf.Addr().Is4() {
			return fieldErr("cidr", "cidr %q is not an IPv4 prefix like 10.1.2.0/24", r.CIDR)
		}
	}
	return nil
}

// NormalizeRule is the one check of a visibility rule's own fields (from and
// to need the store, so the controller checks those): proto lowercase, ""
// for any, and a port only with tcp or udp. It returns the rule as stored and
// compared, or a *FieldError naming proto or port.
func NormalizeRule(r intent.Rule) (intent.Rule, error) {
	var err error
	if r.Proto, err = NormalizeProto(r.Proto); err != nil {
		return r, err
	}
	if r.Port != 0 && r.Proto != "tcp" && r.Proto != "udp" {
		return r, fieldErr("port", "port %d: a port needs proto tcp or udp", r.Port)
	}
	return r, nil
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
		if err := checkFirewallRule(r); err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
		count[r.Dir]++
		if count[r.Dir] > MaxFirewallRules {
			return fmt.Errorf("%s: more than %d rules in one direction", where, MaxFirewallRules)
		}
	}
	return nil
}
