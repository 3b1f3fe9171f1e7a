package tappolicy

import (
	"errors"
	"testing"
)

// FuzzParseSpec: whatever an operator types, ParseSpec answers a value or
// an error naming a field, never panics; what it accepts passes Check, and
// Resolve on it never panics and names a field when it refuses.
func FuzzParseSpec(f *testing.F) {
	f.Add("web", "blue/web/web1", "any", "blue/ops/mon", "tcp", "1-2", "80", "257", true, false)
	f.Add("x", "10.1.1.2", "02:00:0a:01:02:02", "10.1.3.2", "udp", "", "53", "", false, true)
	f.Add("y", "blue/web", "red/app", "red/app/rmon", "47", "", "", "513", true, true)
	f.Add("", "", "", "", "", "0", "-", "x", false, false)
	w := world()
	fields := map[string]bool{"name": true, "sender": true, "receiver": true, "monitor": true, "proto": true,
		"sport": true, "dport": true, "vlan": true}
	f.Fuzz(func(t *testing.T, name, snd, rcv, mon, proto, sport, dport, vlan string, both, cross bool) {
		p, err := ParseSpec(Spec{Name: name, Sender: snd, Receiver: rcv, Monitor: mon, Proto: proto, Sport: sport,
			Dport: dport, VLAN: vlan, BothDirections: both, CrossFarm: cross})
		var fe *FieldError
		if err != nil {
			if !errors.As(err, &fe) || !fields[fe.Field] {
				t.Fatalf("error %v names no flag", err)
			}
			return
		}
		if err := Check(p); err != nil {
			t.Fatalf("ParseSpec accepted %+v but Check says %v", p, err)
		}
		r, err := w.Resolve(p)
		if err != nil {
			if !errors.As(err, &fe) || fe.Field == "" {
				t.Fatalf("resolve error %v names no field", err)
			}
			return
		}
		rules, err := w.Rules(r)
		if err != nil || len(rules) != map[bool]int{true: 2, false: 1}[both] {
			t.Fatalf("resolved %+v but rules %+v %v", r, rules, err)
		}
	})
}
