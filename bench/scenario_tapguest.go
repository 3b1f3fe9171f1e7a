package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/onehop/onehop/internal/backoff"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/lab"
	"github.com/onehop/onehop/internal/netns"
)

// The tap guests: a guest on a tap, as a QEMU VM is, sending to vm2 on h2
// along the same path as the onehop scenario's vm1, which is on a veth
// (the baseline). The guest is a network namespace whose NIC (eth0) is a
// tap of its own; taprelay (taprelay.go) copies frames between that tap's
// fd and the fd of the tap onehop's agent attaches to in h1, as QEMU's
// userspace tap backend does between its tap and a virtio-net guest. So
// iperf3, ping and udhcpc run in the guest unchanged, and what the ratios
// against onehop add is the relay: two more copies and syscalls per frame,
// and the tap's way into and out of the host (tcx ingress on the tap,
// delivery out of the device).
//
// A QEMU guest does not drive it: this machine has no KVM, and under TCG
// the guest's own CPU emulation, not the tap, would be what was measured.
//
// The guest's MAC is the VM's MAC from intent (set on eth0 before it goes
// up); its address comes by DHCP from h1's agent (udhcpc in the guest),
// and setup fails unless both are intent's.
var (
	tapGuestScenario      = newTapGuestScenario("tapguest", "tgvnet", true)
	tapGuestPlainScenario = newTapGuestScenario("tapguest-plain", "tgplain", false)
)

// tapGuestLease applies a lease to eth0 only (Debian's default script would
// rewrite the machine's /etc/resolv.conf) and records it in LEASE_FILE.
const tapGuestLease = `#!/bin/sh
case "$1" in
bound|renew)
  ip addr flush dev "$interface"
  ip addr add "$ip/$subnet" dev "$interface"
  [ -n "$router" ] && ip route replace default via "${router%% *}" dev "$interface"
  echo "$ip $subnet $router" > "$LEASE_FILE"
  ;;
esac
`

// tapGuest is what a tap guest scenario built.
type tapGuest struct {
	vm      intent.VM
	ns      string // the guest's namespace
	relay   *helperProc
	lease   string // "IP MASK ROUTER" as udhcpc gave it
	vnetHdr bool
}

func newTapGuestScenario(name, vm string, vnetHdr bool) *Scenario {
	what := "with a vnet_hdr and TSO/checksum offloads on both taps (QEMU with virtio-net)"
	if !vnetHdr {
		what = "without a vnet_hdr: frames of at most 1514 bytes (a guest NIC without offloads)"
	}
	g := &tapGuest{vnetHdr: vnetHdr}
	return &Scenario{
		Name: name,
		Description: "lab " + onehopLab.Name + ": tap guest " + vm + " on h1 -> vm2 on h2, one subnet; the guest is namespace " +
			netnsPrefix + vm + " whose eth0 is a tap, joined to h1's tap-" + vm + " by a relay process copying frames between the two fds " + what,
		Build: func(ctx context.Context, e *Env) ([]*Pair, error) { return g.build(ctx, e, vm) },
		Baselines: []Baseline{
			// Issue 19: the same path from a guest on a veth (informational:
			// the relay's cost is the figure).
			{Scenario: "onehop"},
		},
		Checks: func(ctx context.Context, e *Env, pairs []*Pair) ([]Check, error) {
			return g.checks(ctx, e, name, pairs)
		},
	}
}

func (g *tapGuest) build(ctx context.Context, e *Env, vm string) ([]*Pair, error) {
	if _, err := exec.LookPath("udhcpc"); err != nil {
		return nil, fmt.Errorf("udhcpc not found in PATH (the tap guest gets its address by DHCP; `make deps` installs it)")
	}
	l, err := e.Lab(ctx, onehopLab)
	if err != nil {
		return nil, err
	}
	st, err := lab.Load(e.cfg.root, l.Name)
	if err != nil {
		return nil, err
	}
	cli := func(args ...string) ([]byte, error) {
		return output(e.onehop(ctx, append(args, "--api", st.APISocket)...))
	}
	tap := "tap-" + vm
	progress("setup: tap guest %s on h1 (%s), its NIC a tap in %s%s", vm, tap, netnsPrefix, vm)
	if g.ns, err = e.Netns(ctx, vm); err != nil {
		return nil, err
	}
	args := []string{"-host-netns", netns.Path(l.Netns("h1")), "-host-tap", tap, "-guest-netns", netns.Path(g.ns), "-guest-tap", "eth0"}
	if g.vnetHdr {
		args = append(args, "-vnet-hdr")
	}
	// The relay makes both taps (down) and holds them: h1's tap exists
	// before the VM does, as QEMU's does before the VM is in intent.
	if g.relay, err = startHelper(ctx, e, tapRelayArg, args...); err != nil {
		return nil, err
	}
	full := "bench/net/" + vm // onehopLab's farm and subnet
	if _, err := cli("vm", "create", full, "--host", "h1", "--interface", tap); err != nil {
		return nil, err
	}
	vms, err := intentVMs(ctx, e, st.APISocket)
	if err != nil {
		return nil, err
	}
	for _, v := range vms {
		if v.FullName() == full {
			g.vm = v
		}
	}
	if g.vm.Interface != tap || g.vm.MAC == "" || g.vm.IP == "" {
		return nil, fmt.Errorf("%s in intent: interface %q, MAC %q, IP %q; want interface %s and a MAC and an IP", full, g.vm.Interface, g.vm.MAC, g.vm.IP, tap)
	}
	// The guest's NIC has the VM's MAC, as QEMU's -device ...,mac= gives it.
	if err := IP(ctx, []string{"-n", g.ns, "link", "set", "eth0", "address", g.vm.MAC},
		[]string{"-n", g.ns, "link", "set", "eth0", "up"}); err != nil {
		return nil, err
	}
	// The agent attaches to the tap as a tap, then brings it up; until
	// then the relay's writes to it are refused (EIO) and the guest's
	// DISCOVERs lost, which udhcpc's retries ride out.
	attached := func() error {
		out, err := cli("stats", "--node", "h1")
		if err != nil {
			return err
		}
		for _, line := range strings.Split(string(out), "\n") {
			if f := strings.Fields(line); len(f) > 2 && f[0] == "tap" && f[1] == "vifs:" && slices.Contains(f[2:], tap) {
				return nil
			}
		}
		return fmt.Errorf("h1's agent shows no tap vif %s:\n%s", tap, out)
	}
	for r := (backoff.Backoff{Initial: 50 * time.Millisecond, Max: time.Second, For: 30 * time.Second}).Start(time.Now()); ; {
		err := attached()
		if err == nil {
			break
		}
		pause, again := r.Next(time.Now())
		if !again {
			return nil, err
		}
		if !backoff.Sleep(ctx, pause) {
			return nil, context.Cause(ctx)
		}
	}
	script, leaseFile := filepath.Join(e.tmp, "udhcpc-"+vm+".sh"), filepath.Join(e.tmp, "lease-"+vm)
	if err := os.WriteFile(script, []byte(tapGuestLease), 0o700); err != nil {
		return nil, err
	}
	if _, err := output(InNetns(g.ns)(ctx, "env", "LEASE_FILE="+leaseFile, "udhcpc", "-i", "eth0", "-n", "-q", "-f", "-t", "20", "-T", "1", "-s", script)); err != nil {
		return nil, fmt.Errorf("guest %s: DHCP from h1: %w", vm, err)
	}
	lease, err := os.ReadFile(leaseFile)
	if err != nil {
		return nil, fmt.Errorf("guest %s: udhcpc recorded no lease: %w", vm, err)
	}
	g.lease = strings.TrimSpace(string(lease))
	if f := strings.Fields(g.lease); len(f) == 0 || f[0] != g.vm.IP {
		return nil, fmt.Errorf("guest %s: DHCP gave %q, want intent's address %s", vm, g.lease, g.vm.IP)
	}
	link, err := output(command(ctx, "ip", "-n", g.ns, "-br", "link", "show", "eth0"))
	if err != nil {
		return nil, err
	}
	if !strings.Contains(strings.ToLower(string(link)), strings.ToLower(g.vm.MAC)) {
		return nil, fmt.Errorf("guest %s: eth0 is %q, want intent's MAC %s", vm, strings.TrimSpace(string(link)), g.vm.MAC)
	}
	progress("setup: tap guest %s: eth0 %s (intent's MAC), DHCP lease %s (intent's address)", vm, g.vm.MAC, g.lease)
	dst, err := l.Addr("vm2")
	if err != nil {
		return nil, err
	}
	return []*Pair{{DstIP: dst, Src: InNetns(g.ns), Dst: e.inLab(l.Name, "vm2"), Server: l.Name + "/vm2"}}, nil
}

// counters asks the relay for its counters.
func (g *tapGuest) counters(ctx context.Context) (map[string]relayCounters, error) {
	if _, err := fmt.Fprintln(g.relay.in, "counters"); err != nil {
		return nil, err
	}
	line, err := g.relay.readLine(ctx, 30*time.Second)
	if err != nil {
		return nil, err
	}
	var cs map[string]relayCounters
	if err := json.Unmarshal([]byte(line), &cs); err != nil {
		return nil, fmt.Errorf("taprelay counters %q: %w", line, err)
	}
	return cs, nil
}

// relayCPU is the relay process's user+system time so far, in seconds.
func (g *tapGuest) relayCPU() (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", g.relay.cmd.Process.Pid))
	if err != nil {
		return 0, fmt.Errorf("taprelay's CPU time: %w", err)
	}
	_, s, err := ParseTaskStat(b)
	return s, err
}

// checks states what the guest is (its MAC and lease against intent's),
// then runs one TCP and one 64-byte UDP test more, reading the relay's CPU
// time and counters around each: what the copying costs, and how big the
// frames it copied were (GSO superpackets cross as one frame with a
// vnet_hdr).
func (g *tapGuest) checks(ctx context.Context, e *Env, name string, pairs []*Pair) ([]Check, error) {
	if len(pairs) != 1 || g.relay == nil {
		return nil, fmt.Errorf("%s: not built", name)
	}
	p := pairs[0]
	ok := true
	out := []Check{{Scenario: name, Name: "guest is intent's VM", Value: 1, Unit: "", Met: &ok,
		Detail: fmt.Sprintf("%s: eth0's MAC %s is intent's; its DHCP lease from h1 (udhcpc) %q has intent's address %s", g.vm.FullName(), g.vm.MAC, g.lease, g.vm.IP)}}
	secs := strconv.Itoa(e.cfg.seconds)
	for _, t := range []struct {
		test  string
		argv  []string
		parse func([]byte) (Measurement, error)
	}{
		{"tcp", []string{"iperf3", "-c", p.DstIP, "-p", iperfPort, "-t", secs, "-C", "cubic", "-J"}, ParseIperfTCP},
		{"udp64", []string{"iperf3", "-c", p.DstIP, "-p", iperfPort, "-u", "-l", strconv.Itoa(udpLen), "-b", "0", "-t", secs, "-J"},
			func(b []byte) (Measurement, error) { return ParseIperfUDP(b, udpLen) }},
	} {
		c0, err := g.counters(ctx)
		if err != nil {
			return nil, err
		}
		cpu0, err := g.relayCPU()
		if err != nil {
			return nil, err
		}
		start := time.Now()
		res, err := output(e.tool(p.Src(ctx, t.argv...)))
		if err != nil {
			return nil, err
		}
		wall := time.Since(start).Seconds()
		cpu1, err := g.relayCPU()
		if err != nil {
			return nil, err
		}
		c1, err := g.counters(ctx)
		if err != nil {
			return nil, err
		}
		m, err := t.parse(res)
		if err != nil {
			return nil, err
		}
		cpu := cpu1 - cpu0
		up, down := c1["guest->host"], c1["host->guest"]
		frames, bytes := float64(up.Frames-c0["guest->host"].Frames), float64(up.Bytes-c0["guest->host"].Bytes)
		dropped := up.Dropped - c0["guest->host"].Dropped + down.Dropped - c0["host->guest"].Dropped
		copied := fmt.Sprintf("it copied %.0f frames guest->host (%.0f bytes each on average) and %d back; %d refused",
			frames, bytes/max(frames, 1), down.Frames-c0["host->guest"].Frames, dropped)
		busy := 100 * cpu / wall
		switch t.test {
		case "tcp":
			gb := m.Extra["receivedBytes"] / 1e9
			out = append(out, Check{Scenario: name, Name: "relay CPU per GB of TCP", Value: 1e3 * cpu / max(gb, 1e-9), Unit: "CPU-ms/GB",
				Detail: fmt.Sprintf("%.2f Gbit/s; the relay was busy %.0f%% of one CPU (%.2f CPU-s in %.1f s); %s", m.Value/1e9, busy, cpu, wall, copied)})
		case "udp64":
			out = append(out, Check{Scenario: name, Name: "relay CPU per 64 B datagram copied", Value: 1e9 * cpu / max(frames, 1), Unit: "ns",
				Detail: fmt.Sprintf("%.0f kpps received by vm2; the relay was busy %.0f%% of one CPU (%.2f CPU-s in %.1f s); %s", m.Value/1e3, busy, cpu, wall, copied)})
		}
	}
	return out, nil
}
