package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/onehop/onehop/internal/cni"
	"github.com/onehop/onehop/internal/lab"
	"github.com/onehop/onehop/internal/netns"
)

// The CNI benchmark (issue 19): how long a container waits from its
// runtime's ADD to its first packet answered, with onehop's plugin and, on
// the same machine in the same run, with the reference plugins
// (containernetworking-plugins' bridge and host-local), which do far less:
// no controller, no agent, no program to attach.
//
// Both are driven by the real cnitool, run in a host's namespace as a
// runtime runs its plugins. onehop's host is lab benchoh's h1 (farm bench,
// subnet net; h1's agent attaches). bridge's is a namespace of the bench's
// own (ohbench-cnibr), which holds its bridge, so neither side sees the
// other's links. Each container is a fresh namespace, made before the
// clock starts, with a raw ICMP socket already open in it (echoprobe.go).
// The clock runs from the start of `cnitool add` (its launcher, `ip netns
// exec`, included, the same on both sides) until the first echo reply from
// the container's gateway reaches that socket. Echo requests go out every
// millisecond from the moment ADD returns, when a runtime would start the
// container.
//
// The gateway, not a VM on another host, is pinged because it is the
// destination both sides have: bridge's gateway is its bridge's address on
// the host, and onehop's is answered by the vif program on the container's
// link (docs/datapath.md, "The gateway answers"), so the reply also proves
// the agent's program is there. A VM across the fabric would add the first
// ARP resolution through the fabric, which bridge has no counterpart for.
// The warm-up container of each side (not recorded) is the control: it
// reaches vm2 on h2 (onehop), and its gateway answers nothing once it is
// DELed.
//
// Every round runs a batch per side, in rotated order: cniBatch ADDs in a
// row, each container kept until the batch is done (so the last ADD finds
// cniBatch-1 others on its host), then the batch's DELs.
const (
	cniBatch        = 10
	cniOnehopNet    = netnsPrefix + "cni-onehop" // network names, in libcni's cache file names
	cniBridgeNet    = netnsPrefix + "cni-bridge"
	cniBridgeHost   = "cnibr" // the bridge side's host namespace (netnsPrefix+)
	cniBridgeDev    = "ohbcni0"
	cniBridgeSubnet = "172.31.254.0/24"
	cniRefPlugins   = "/usr/lib/cni" // Debian's containernetworking-plugins
	cniIPAMDir      = ".cni-ipam"    // under the bench's root: host-local's leases
	cniResultsDir   = "/var/lib/cni/results"
	cniProbeTimeout = 5 * time.Second

	cniTargetP99   = 300 // ms: onehop's p99
	cniTargetRatio = 5   // onehop's p50 over bridge's
)

var cniScenario = &Scenario{
	Name: "cni",
	Description: fmt.Sprintf("CNI ADD to the first echo reply from the gateway, real cnitool: onehop's plugin on lab %s's h1 (bench/net) "+
		"vs the reference bridge+host-local in %s%s; %d containers of each per round, batches interleaved", onehopLab.Name, netnsPrefix, cniBridgeHost, cniBatch),
	Tests: []string{}, // its figures are its checks
	Build: func(ctx context.Context, e *Env) ([]*Pair, error) {
		return nil, cniRun.build(ctx, e)
	},
	Checks: func(ctx context.Context, e *Env, _ []*Pair) ([]Check, error) {
		return cniRun.checks(ctx, e)
	},
}

// cniRun is what the cni scenario built.
var cniRun = &cniBench{}

// cniSide is one plugin's host: where cnitool runs and which network it adds.
type cniSide struct {
	name    string // onehop, bridge
	tag     string // in its containers' namespace names
	network string
	hostNS  string
}

type cniBench struct {
	sides   []*cniSide // onehop, bridge
	binDir  string     // CNI_PATH
	confDir string     // NETCONFPATH
	api     string     // the lab's API socket, for `onehop get vms`
	ipamDir string     // host-local's dataDir
	vm2     netip.Addr // the onehop control's destination across the fabric
	hostIfs []string   // onehop's host ends, from ADD's results, for the leftover check
}

// cniSample is one container's timings.
type cniSample struct {
	total  time.Duration // `cnitool add` started -> first echo reply
	add    time.Duration // `cnitool add` started -> exited
	echoes int           // requests sent until the reply
	stall  string        // what the container looked like when its reply came late
}

// cniStall is how long after ADD returned a first reply is late: the
// first echo request or its ARP was lost (the kernel asks again after 1 s).
const cniStall = 100 * time.Millisecond

// cniStallState is what a container whose first reply came late shows:
// its link's counters (a TX drop there is a request its eth0 could not
// send yet) and its neighbours.
func cniStallState(ctx context.Context, ns string) string {
	var parts []string
	for _, argv := range [][]string{{"ip", "-s", "-o", "link", "show", "eth0"}, {"ip", "neigh"}} {
		out, err := command(ctx, append([]string{"ip", "netns", "exec", ns}, argv...)...).CombinedOutput()
		if err != nil {
			out = append(out, []byte(err.Error())...)
		}
		parts = append(parts, strings.Join(strings.Fields(string(out)), " "))
	}
	return strings.Join(parts, " | ")
}

// cniContainer is a container of a batch: its namespace and probe.
type cniContainer struct {
	ns    string
	probe *echoProbe
	gw    netip.Addr
}

// cniRefPlugin is where Debian's reference plugin name is.
func cniRefPlugin(name string) string { return filepath.Join(cniRefPlugins, name) }

func (b *cniBench) build(ctx context.Context, e *Env) error {
	if _, err := exec.LookPath("cnitool"); err != nil {
		return errors.New("cnitool not found in PATH (`make deps` installs it: scripts/install-go-tools.sh)")
	}
	for _, p := range []string{"bridge", "host-local"} {
		if _, err := os.Stat(cniRefPlugin(p)); err != nil {
			return fmt.Errorf("the reference CNI plugin %s: %w (`make deps` installs Debian's containernetworking-plugins)", p, err)
		}
	}
	l, err := e.Lab(ctx, onehopLab)
	if err != nil {
		return err
	}
	st, err := lab.Load(e.cfg.root, l.Name)
	if err != nil {
		return err
	}
	b.api, b.ipamDir = st.APISocket, cniIPAMPath(e.cfg.root)
	vm2, err := l.Addr("vm2")
	if err != nil {
		return err
	}
	if b.vm2, err = netip.ParseAddr(vm2); err != nil {
		return fmt.Errorf("vm2's address %q: %w", vm2, err)
	}
	brHost, err := e.Netns(ctx, cniBridgeHost)
	if err != nil {
		return err
	}
	b.sides = []*cniSide{
		{name: "onehop", tag: "o", network: cniOnehopNet, hostNS: l.Netns("h1")},
		{name: "bridge", tag: "b", network: cniBridgeNet, hostNS: brHost},
	}

	// A runtime's plugin directory and network configs. onehop's is
	// docs/guests.md's, for the lab's API over TLS; bridge's the usual
	// gateway bridge, without masquerading (no iptables in the way).
	b.binDir, b.confDir = filepath.Join(e.tmp, "cni-bin"), filepath.Join(e.tmp, "cni-conf")
	for _, d := range []string{b.binDir, b.confDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	links := map[string]string{"onehop": e.cfg.binary, "bridge": cniRefPlugin("bridge"), "host-local": cniRefPlugin("host-local")}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(b.binDir, name)); err != nil {
			return err
		}
	}
	onehopConf := fmt.Sprintf(`{
  "cniVersion": "1.1.0",
  "name": %q,
  "plugins": [{"type": "onehop", "farm": "bench", "subnet": "net", "api": %q, "ca": %q, "tokenFile": %q, "host": "h1", "attachTimeout": "10s"}]
}
`, cniOnehopNet, st.APIURL, lab.CAFile(st), lab.TokenFile(st))
	// containernetworking-plugins 1.1 speaks up to 1.0.0.
	bridgeConf := fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": %q,
  "plugins": [{"type": "bridge", "bridge": %q, "isGateway": true, "ipMasq": false,
    "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "dataDir": %q}}]
}
`, cniBridgeNet, cniBridgeDev, cniBridgeSubnet, b.ipamDir)
	for name, conf := range map[string]string{cniOnehopNet: onehopConf, cniBridgeNet: bridgeConf} {
		if err := os.WriteFile(filepath.Join(b.confDir, name+".conflist"), []byte(conf), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// cnitool runs `cnitool VERB NETWORK NETNS` in the side's host namespace.
func (b *cniBench) cnitool(ctx context.Context, s *cniSide, verb, ns string) ([]byte, error) {
	cmd := InNetns(s.hostNS)(ctx, "cnitool", verb, s.network, netns.Path(ns))
	cmd.Env = append(os.Environ(), "CNI_PATH="+b.binDir, "NETCONFPATH="+b.confDir, "CNI_IFNAME=eth0")
	return output(cmd)
}

// add makes container n of a batch and times its ADD until the first
// reply. The container is returned whenever its namespace exists, so that
// the batch's DEL removes whatever the ADD made.
func (b *cniBench) add(ctx context.Context, e *Env, s *cniSide, n string) (*cniContainer, cniSample, error) {
	ns, err := e.Netns(ctx, "cni"+s.tag+n)
	if err != nil {
		return nil, cniSample{}, err
	}
	c := &cniContainer{ns: ns}
	if c.probe, err = openEchoProbe(ns); err != nil {
		return c, cniSample{}, err
	}
	start := time.Now()
	out, err := b.cnitool(ctx, s, "add", ns)
	var x cniSample
	x.add = time.Since(start)
	if err != nil {
		return c, x, err
	}
	var r cni.Result
	if err := json.Unmarshal(out, &r); err != nil || len(r.IPs) == 0 {
		return c, x, fmt.Errorf("cnitool add %s: no address in its result (%v):\n%s", ns, err, out)
	}
	if c.gw, err = netip.ParseAddr(r.IPs[0].Gateway); err != nil {
		return c, x, fmt.Errorf("cnitool add %s: gateway %q: %w", ns, r.IPs[0].Gateway, err)
	}
	x.echoes, err = c.probe.firstReply(ctx, c.gw, cniProbeTimeout)
	x.total = time.Since(start)
	if x.total-x.add > cniStall || err != nil {
		x.stall = cniStallState(ctx, ns)
	}
	if err != nil {
		return c, x, fmt.Errorf("%s, %s's gateway, after ADD: %w (%s)", ns, s.name, err, x.stall)
	}
	if s.name == "onehop" {
		for _, i := range r.Interfaces {
			if i.Sandbox == "" {
				b.hostIfs = append(b.hostIfs, i.Name)
			}
		}
	}
	return c, x, nil
}

// del DELs c and removes its namespace; it returns how long `cnitool del`
// took.
func (b *cniBench) del(ctx context.Context, s *cniSide, c *cniContainer) (time.Duration, error) {
	c.probe.close()
	start := time.Now()
	_, err := b.cnitool(ctx, s, "del", c.ns)
	took := time.Since(start)
	if err != nil {
		return took, err
	}
	return took, IP(ctx, []string{"netns", "del", c.ns})
}

// floor times what both sides' ADDs pay before any plugin runs: `ip
// netns exec` into the host's namespace and cnitool's own start, with no
// arguments (it prints its usage and exits 1).
func (b *cniBench) floor(ctx context.Context, s *cniSide) (time.Duration, error) {
	cmd := InNetns(s.hostNS)(ctx, "cnitool")
	cmd.Env = append(os.Environ(), "CNI_PATH="+b.binDir, "NETCONFPATH="+b.confDir)
	start := time.Now()
	out, err := cmd.CombinedOutput()
	took := time.Since(start)
	var exit *exec.ExitError
	if err != nil && !(errors.As(err, &exit) && strings.Contains(string(out), "cnitool")) {
		return took, fmt.Errorf("cnitool without arguments in %s: %v: %s", s.hostNS, err, out)
	}
	return took, nil
}

// control is the warm-up container of side s, not recorded: it gets its
// reply, reaches vm2 across the fabric (onehop), and its gateway answers
// nothing once it is DELed (another probe, opened before the ADD, in the
// same namespace).
func (b *cniBench) control(ctx context.Context, e *Env, s *cniSide) (string, error) {
	c, x, err := b.add(ctx, e, s, "ctl")
	if err != nil {
		if c != nil {
			b.del(ctx, s, c) //nolint:errcheck // reporting the ADD's failure
		}
		return "", fmt.Errorf("%s warm-up: %w", s.name, err)
	}
	what := fmt.Sprintf("%s: warm-up ADD to its gateway %s's reply %.1f ms", s.name, c.gw, ms(x.total))
	after, err := openEchoProbe(c.ns)
	if err != nil {
		return "", err
	}
	defer after.close()
	if s.name == "onehop" {
		sent, err := c.probe.firstReply(ctx, b.vm2, cniProbeTimeout)
		if err != nil {
			b.del(ctx, s, c) //nolint:errcheck // reporting the probe's failure
			return "", fmt.Errorf("onehop warm-up container to vm2 on h2: %w", err)
		}
		what += fmt.Sprintf(", vm2 on h2 (%s) answered after %d request(s)", b.vm2, sent)
	}
	if _, err := b.del(ctx, s, c); err != nil {
		return "", fmt.Errorf("%s warm-up DEL: %w", s.name, err)
	}
	if sent, err := after.firstReply(ctx, c.gw, 200*time.Millisecond); err == nil {
		return "", fmt.Errorf("%s warm-up: %s still answers after DEL (%d requests sent): the reply is not the ADD's", s.name, c.gw, sent)
	}
	return what + ", and nothing after DEL (200 ms of requests)", nil
}

func (b *cniBench) checks(ctx context.Context, e *Env) ([]Check, error) {
	if len(b.sides) != 2 {
		return nil, errors.New("cni: not built")
	}
	linksBefore, err := b.hostLinks(ctx)
	if err != nil {
		return nil, err
	}
	var controls []string
	for _, s := range b.sides {
		what, err := b.control(ctx, e, s)
		if err != nil {
			return nil, err
		}
		progress("cni: %s", what)
		controls = append(controls, what)
	}
	samples := map[string][]cniSample{}
	dels := map[string][]float64{}
	failed, why := map[string]int{}, map[string]string{}
	var loads, floor []float64
	for r := 0; r < e.cfg.rounds; r++ {
		for _, i := range Rotation(len(b.sides), r) {
			s := b.sides[i]
			for k := 0; k < cniBatch/2; k++ {
				took, err := b.floor(ctx, s)
				if err != nil {
					return nil, err
				}
				floor = append(floor, ms(took))
			}
			var batch []*cniContainer
			for k := 1; k <= cniBatch; k++ {
				c, x, err := b.add(ctx, e, s, fmt.Sprintf("%02d%02d", r+1, k))
				if ctx.Err() != nil {
					return nil, context.Cause(ctx)
				}
				if c != nil {
					batch = append(batch, c)
				}
				if err != nil {
					progress("round %d/%d: cni %-6s ADD %2d: FAILED: %v", r+1, e.cfg.rounds, s.name, k, err)
					if failed[s.name]++; why[s.name] == "" {
						why[s.name] = strings.ReplaceAll(err.Error(), "\n", " | ")
					}
					continue
				}
				if x.stall != "" {
					progress("round %d/%d: cni %-6s ADD %2d: first reply %.0f ms after ADD returned: %s", r+1, e.cfg.rounds, s.name, k, ms(x.total-x.add), x.stall)
				}
				samples[s.name] = append(samples[s.name], x)
			}
			loads = append(loads, load1())
			for _, c := range batch {
				took, err := b.del(ctx, s, c)
				if err != nil {
					return nil, fmt.Errorf("cni %s: %w", s.name, err)
				}
				dels[s.name] = append(dels[s.name], ms(took))
			}
			xs := samples[s.name][max(0, len(samples[s.name])-len(batch)):]
			var tot []float64
			for _, x := range xs {
				tot = append(tot, ms(x.total))
			}
			progress("round %d/%d: cni %-6s %d ADDs to first reply: median %.1f ms, max %.1f ms; load %.2f",
				r+1, e.cfg.rounds, s.name, len(xs), Summarize(tot).Median, Summarize(tot).Max, loads[len(loads)-1])
		}
	}

	out := []Check{{Scenario: "cni", Name: "controls", Value: 1, Met: ptr(true), Detail: strings.Join(controls, "; ")}}
	p50 := map[string]float64{}
	for _, s := range b.sides {
		if failed[s.name] > 0 {
			out = append(out, Check{Scenario: "cni", Name: s.name + " failed ADDs", Value: float64(failed[s.name]),
				Unit: fmt.Sprintf("of %d", e.cfg.rounds*cniBatch), Op: "<=", Target: 0, Met: ptr(false), Detail: "the first: " + why[s.name]})
		}
		xs := samples[s.name]
		if len(xs) == 0 {
			continue
		}
		var tot, add, reply, echoes []float64
		stalls, firstStall := 0, ""
		for _, x := range xs {
			if x.stall != "" {
				if stalls++; firstStall == "" {
					firstStall = fmt.Sprintf("%.0f ms after ADD: %s", ms(x.total-x.add), x.stall)
				}
			}
			tot, add, reply = append(tot, ms(x.total)), append(add, ms(x.add)), append(reply, ms(x.total-x.add))
			echoes = append(echoes, float64(x.echoes))
		}
		t := Summarize(tot)
		p50[s.name] = t.Median
		p99 := Percentile(tot, 99)
		detail := fmt.Sprintf("%d ADDs: to first reply p50 %.1f p99 %.1f ms (min %.1f); of which `cnitool add` p50 %.1f p99 %.1f ms, "+
			"then the reply p50 %.2f p99 %.2f ms (%.0f echo request(s) p50, %.0f max); DEL p50 %.1f ms",
			t.N, t.Median, p99, t.Min, Summarize(add).Median, Percentile(add, 99), Summarize(reply).Median, Percentile(reply, 99),
			Summarize(echoes).Median, Summarize(echoes).Max, Summarize(dels[s.name]).Median)
		if stalls > 0 {
			out = append(out, Check{Scenario: "cni", Name: s.name + " first replies late", Value: float64(stalls), Unit: fmt.Sprintf("of %d", len(xs)),
				Detail: fmt.Sprintf("more than %v after ADD returned (a lost first request or ARP; the kernel asks again after 1 s); the first: %s", cniStall, firstStall)})
		}
		c99 := Check{Scenario: "cni", Name: s.name + " ADD to first reply, p99", Value: p99, Unit: "ms"}
		if s.name == "onehop" {
			c99.Op, c99.Target, c99.Met = "<=", cniTargetP99, ptr(p99 <= cniTargetP99)
		}
		out = append(out, Check{Scenario: "cni", Name: s.name + " ADD to first reply, p50", Value: t.Median, Unit: "ms", Detail: detail}, c99)
	}
	f := Summarize(floor)
	out = append(out, Check{Scenario: "cni", Name: "floor: ip netns exec + cnitool, no plugin, p50", Value: f.Median, Unit: "ms",
		Detail: fmt.Sprintf("what every ADD above pays before a plugin runs, %d runs in the hosts' namespaces beside the batches: p50 %.1f p99 %.1f ms (min %.1f)",
			f.N, f.Median, Percentile(floor, 99), f.Min)})
	ratio := Ratio(p50["onehop"], p50["bridge"])
	out = append(out, Check{Scenario: "cni", Name: "p50 onehop / bridge", Value: ratio, Unit: "x", Op: "<=", Target: cniTargetRatio,
		Met: ptr(MeetsTarget(ratio, cniTargetRatio, true)), Detail: fmt.Sprintf("1-minute load %.2f-%.2f over the batches", Summarize(loads).Min, Summarize(loads).Max)})

	left, err := b.leftAfterDEL(ctx, e, linksBefore)
	if err != nil {
		return nil, err
	}
	detail := "no VM of a container in intent, no link of one on h1 or in " + netnsPrefix + cniBridgeHost + ", no host-local lease, no libcni cache entry"
	if len(left) > 0 {
		detail = strings.Join(left, "; ")
	}
	out = append(out, Check{Scenario: "cni", Name: "left after every DEL", Value: float64(len(left)), Op: "<=", Target: 0, Met: ptr(len(left) == 0), Detail: detail})
	return out, nil
}

func ptr[T any](v T) *T { return &v }

// hostLinks lists the links of both sides' hosts, one "NS NAME" each.
func (b *cniBench) hostLinks(ctx context.Context) ([]string, error) {
	var out []string
	for _, s := range b.sides {
		l, err := output(command(ctx, "ip", "-n", s.hostNS, "-o", "link", "show"))
		if err != nil {
			return nil, err
		}
		for _, line := range strings.Split(string(l), "\n") {
			// "7: vif-c1234@if2: <...": the name, without its peer.
			if f := strings.Fields(line); len(f) > 1 {
				name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
				out = append(out, s.hostNS+" "+name)
			}
		}
	}
	return out, nil
}

// leftAfterDEL lists what the DELs should have removed and did not: VMs
// of the containers in intent, links on the hosts that were not there
// before (bar bridge's own bridge), host-local's leases, libcni's cache.
func (b *cniBench) leftAfterDEL(ctx context.Context, e *Env, linksBefore []string) ([]string, error) {
	var left []string
	vms, err := intentVMs(ctx, e, b.api)
	if err != nil {
		return nil, err
	}
	for _, v := range vms {
		if slices.Contains(b.hostIfs, v.Interface) {
			left = append(left, "vm "+v.FullName())
		}
	}
	links, err := b.hostLinks(ctx)
	if err != nil {
		return nil, err
	}
	for _, l := range links {
		if !slices.Contains(linksBefore, l) && !strings.HasSuffix(l, " "+cniBridgeDev) {
			left = append(left, "link "+l)
		}
	}
	leases, _ := filepath.Glob(filepath.Join(b.ipamDir, "*", "*.*.*.*"))
	for _, l := range leases {
		left = append(left, "host-local lease "+l)
	}
	cached, _ := filepath.Glob(filepath.Join(cniResultsDir, netnsPrefix+"cni-*"))
	for _, c := range cached {
		left = append(left, "libcni cache "+c)
	}
	return left, nil
}

// cniIPAMPath is host-local's dataDir under the bench's root: outside the
// run's temporary directory, so that the next run finds what an
// interrupted one left there.
func cniIPAMPath(root string) string { return filepath.Join(root, cniIPAMDir) }

// cniLeftovers lists the files of the cni scenario's that may outlive a
// run (env.go's leftovers and cleanup): host-local's leases and libcni's
// cache entries of the bench's networks. Its namespaces go with the
// bench's others, its VMs and onehop's links with the lab, the bridge with
// its host's namespace.
func cniLeftovers(root string) []string {
	var out []string
	if _, err := os.Stat(cniIPAMPath(root)); err == nil {
		out = append(out, cniIPAMPath(root))
	}
	cached, _ := filepath.Glob(filepath.Join(cniResultsDir, netnsPrefix+"cni-*"))
	return append(out, cached...)
}
