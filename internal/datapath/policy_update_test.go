package datapath

import (
	"fmt"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/google/gopacket/layers"

	"github.com/onehop/onehop/internal/bpftest"
	"github.com/onehop/onehop/internal/intent"
)

// The rule change every test here makes: one visibility rule withdrawn and
// one added, a firewall removed from web1 and one added to web3.
func rulesBeforeAndAfter() (before, after intent.Desired) {
	before = testDesired()
	before.Local[0].Firewall = &intent.Firewall{DefaultIn: "allow", DefaultOut: "allow", Rules: []intent.FirewallRule{
		{Dir: "in", Proto: "udp", Action: "deny"},
	}}
	after = testDesired()
	after.Visibility = append(after.Visibility[1:], intentVis(1, 1, 1, 2, 17, 53))
	after.Local[1].Firewall = &intent.Firewall{DefaultIn: "deny", DefaultOut: "allow"}
	return before, after
}

// probe is one packet whose verdict tells the two rule sets apart.
type probe struct {
	name   string
	uplink bool
	in     frame
}

func ruleProbes() []probe {
	tcp, udp, icmp := layers.IPProtocolTCP, layers.IPProtocolUDP, layers.IPProtocolICMPv4
	return []probe{
		{"web1 -> db1 tcp/5432 (rule withdrawn)", false, frame{Src: vmac(web1), Dst: vmac(gw), Saddr: web1, Daddr: db1, Proto: tcp, Dport: 5432}},
		{"web1 -> db1 udp/53 (rule added)", false, frame{Src: vmac(web1), Dst: vmac(gw), Saddr: web1, Daddr: db1, Proto: udp, Dport: 53}},
		{"web2 -> web3 tcp/80 (web3's firewall added)", true, frame{Src: h2MAC, Dst: h1MAC, Saddr: web2, Daddr: web3, Proto: tcp, Dport: 80}},
		{"web2 -> web1 udp/99 (web1's firewall removed)", true, frame{Src: h2MAC, Dst: h1MAC, Saddr: web2, Daddr: web1, Proto: udp, Dport: 99}},
		{"db1 -> web1 ping (allowed by both)", true, frame{Src: h2MAC, Dst: h1MAC, Saddr: db1, Daddr: web1, Proto: icmp, TTL: 63}},
	}
}

// verdicts runs every probe on a clean conntrack (so each verdict is the
// rules', not an earlier probe's flow) and says which were let through.
func verdicts(t *testing.T, k *Kernel) string {
	t.Helper()
	clearConntrack(t, k)
	out := ""
	for _, p := range ruleProbes() {
		prog := k.VifProgram()
		if p.uplink {
			prog = k.UplinkProgram()
		}
		in := p.in.bytes(t)
		ret, err := prog.Run(&ebpf.RunOptions{Data: in, DataOut: make([]byte, len(in)+64)})
		if err != nil {
			t.Fatalf("%s: BPF_PROG_RUN: %v", p.name, err)
		}
		switch ret {
		case bpftest.ActRedirect:
			out += "P"
		case bpftest.ActShot:
			out += "-"
		default:
			t.Fatalf("%s: verdict %d", p.name, ret)
		}
	}
	return out
}

func clearConntrack(t *testing.T, k *Kernel) {
	t.Helper()
	for key := range conntrackEntries(t, k) {
		if err := k.vif.Conntrack.Delete(key); err != nil {
			t.Fatalf("clear conntrack: %v", err)
		}
	}
}

func compiled(t *testing.T, d intent.Desired) Entries {
	t.Helper()
	return compileTest(t, d, testIfindex)
}

// A rule change is never, even for a moment, more permissive than both the
// old and the new rule set: after every single map write of the change,
// each probe's verdict is the old set's or, all at once, the new set's.
func TestPrivilegedARuleChangeSwitchesAtOnce(t *testing.T) {
	before, after := rulesBeforeAndAfter()
	k := loadTestKernelWith(t, before)
	old := verdicts(t, k)
	// What the change must amount to, or the probes prove nothing.
	if old != "P-P-P" {
		t.Fatalf("probes under the old rules: %s, want P-P-P", old)
	}
	steps, err := k.plan(compiled(t, after))
	if err != nil {
		t.Fatal(err)
	}
	const want = "-P-PP"
	switched := -1
	for i, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("step %d (%s): %v", i, s.what, err)
		}
		got := verdicts(t, k)
		if allowsMore(got, old) && allowsMore(got, want) {
			t.Fatalf("after step %d (%s) the probes say %s: more permissive than the old rules (%s) and the new (%s)", i, s.what, got, old, want)
		}
		switch {
		case got == old && switched < 0:
		case got == want:
			if switched < 0 {
				switched = i
			}
		default:
			t.Fatalf("after step %d (%s) the probes say %s: neither the old rules (%s) nor the new (%s)", i, s.what, got, old, want)
		}
	}
	if switched < 0 {
		t.Fatalf("after all %d steps the probes still say %s, want %s", len(steps), verdicts(t, k), want)
	}
	if steps[switched].what != "write config" {
		t.Fatalf("the rules changed at step %d (%s), want at the epoch's one write", switched, steps[switched].what)
	}
	// The new set was whole in the maps before that write and not
	// consulted: the step before it still judged by the old rules.
	if switched < 5 {
		t.Fatalf("the switch came at step %d: the new set cannot have been written beside the old", switched)
	}
	t.Logf("%d steps; the rules changed at step %d (%s)", len(steps), switched, steps[switched].what)
	// And the old generation is gone.
	sets, err := k.readPolicy()
	if err != nil {
		t.Fatal(err)
	}
	var cfg NodeConfig
	k.vif.Config.Lookup(uint32(0), &cfg)
	if !sets[cfg.PolicyEpoch&1^1].empty() {
		t.Fatalf("the old rule set is still in the maps: %+v", sets[cfg.PolicyEpoch&1^1])
	}
}

// allowsMore reports whether verdicts a let through a probe b does not.
func allowsMore(a, b string) bool {
	for i := range a {
		if a[i] == 'P' && b[i] != 'P' {
			return true
		}
	}
	return false
}

// The probes do tell a bad update: written map by map in place, in the
// order Apply wrote them before rule generations (flags, visibility,
// firewall rules, firewalls), some moment lets through more than either
// rule set would.
func TestPrivilegedProbesCatchAPiecemealRuleChange(t *testing.T) {
	before, after := rulesBeforeAndAfter()
	k := loadTestKernelWith(t, before)
	old := verdicts(t, k)
	const want = "-P-PP"
	e := compiled(t, after)
	var cfg NodeConfig
	if err := k.vif.Config.Lookup(uint32(0), &cfg); err != nil {
		t.Fatal(err)
	}
	gen := uint8(cfg.PolicyEpoch & 1)
	sets, err := k.readPolicy()
	if err != nil {
		t.Fatal(err)
	}
	naive := []step{
		{"endpoints", func() error { return syncMap(k.vif.Endpoints, e.Endpoints, "endpoints", nil) }},
		{"vifs", func() error { return syncMap(k.vif.Vifs, e.Vifs, "vifs", nil) }},
	}
	naive = append(naive, k.deleteSet(policySet{vis: sets[gen].vis}, gen)...)
	naive = append(naive, k.writeSet(policySet{vis: e.Visibility}, gen)...)
	naive = append(naive, k.deleteSet(policySet{rules: sets[gen].rules}, gen)...)
	naive = append(naive, k.writeSet(policySet{rules: e.FirewallRules}, gen)...)
	naive = append(naive, k.deleteSet(policySet{fw: sets[gen].fw}, gen)...)
	naive = append(naive, k.writeSet(policySet{fw: e.Firewalls}, gen)...)
	worse := ""
	for i, s := range naive {
		if err := s.do(); err != nil {
			t.Fatalf("step %d (%s): %v", i, s.what, err)
		}
		if got := verdicts(t, k); allowsMore(got, old) && allowsMore(got, want) && worse == "" {
			worse = fmt.Sprintf("after step %d (%s): %s", i, s.what, got)
		}
	}
	if got := verdicts(t, k); got != want {
		t.Fatalf("the piecemeal change ended at %s, want %s", got, want)
	}
	if worse == "" {
		t.Fatal("a piecemeal change never let more through than both rule sets: the probes cannot tell a bad update from a good one")
	}
	t.Logf("piecemeal, as expected, let more through than old (%s) and new (%s) %s", old, want, worse)
}

// An Apply that changes nothing moves no epoch: admitted flows keep passing
// on one lookup without being checked again.
func TestPrivilegedAnUnchangedRuleSetKeepsItsEpoch(t *testing.T) {
	k := loadTestKernel(t)
	var before, after NodeConfig
	k.vif.Config.Lookup(uint32(0), &before)
	applyDesired(t, k, testDesired())
	k.vif.Config.Lookup(uint32(0), &after)
	if before.PolicyEpoch != after.PolicyEpoch || before.PolicyEpoch == 0 {
		t.Fatalf("epoch %d -> %d, want it unchanged (and moved on from 0 by the first rules)", before.PolicyEpoch, after.PolicyEpoch)
	}
}
