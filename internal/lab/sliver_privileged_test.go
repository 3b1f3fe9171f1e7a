package lab

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/netns"
	"github.com/onehop/onehop/internal/testenv"
	"github.com/onehop/onehop/internal/topology"
)

// portshareBridge is a bridge lab (no controller, no agents, no datapath:
// the plumbing alone) with slivers on a one- and a two-uplink host and an
// external machine.
const portshareBridge = `name: %s
datapath: bridge
fabric: {cidr: 192.168.77.0/24}
hosts:
  - name: h1
  - name: h2
    uplinks: 2
slivers:
  - {name: s1, host: h1, ports: 10000-10099}
  - {name: s2, host: h1, ports: 10100-10199}
  - {name: s3, host: h2, ports: "1:20000-20099"}
externals: [{name: inet}]
`

// upBridgeLab builds topo (a format with the lab's name) under a root of its
// own and removes everything at the end of the test, failed or not.
var (
	buildOnce sync.Once
	builtBin  string
	buildErr  error
)

// onehopBinary builds cmd/onehop once per test run: the daemons a lab
// starts (`onehop vnat run` in a vnat: true node) run from it, not from the
// test binary Up would otherwise use.
func onehopBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "onehop-lab-test-")
		if err != nil {
			buildErr = err
			return
		}
		builtBin = filepath.Join(dir, "onehop")
		if out, err := exec.Command("go", "build", "-o", builtBin, "../../cmd/onehop").CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %w: %s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return builtBin
}

func upBridgeLab(t *testing.T, topo string) (*State, *topology.File) {
	t.Helper()
	testenv.RequireRoot(t, "builds network namespaces and cgroups")
	name := fmt.Sprintf("lt%d", rand.Intn(1_000_000))
	f, err := topology.Parse(filepath.Join(t.TempDir(), "t.yaml"), []byte(fmt.Sprintf(topo, name)))
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	st, err := Up(context.Background(), f, Options{Root: root, Timeout: 20 * time.Second, Binary: onehopBinary(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := Teardown(st, nil); err != nil {
			t.Errorf("teardown: %v", err)
		}
		if left, _ := netns.List(NamespaceOf(name, "")); len(left) > 0 {
			t.Errorf("namespaces left after teardown: %v", left)
		}
	})
	return st, f
}

// nodeLink returns ifname in node's namespace of lab st.
func nodeLink(t *testing.T, st *State, node, ifname string) (netlink.Link, []netlink.Addr) {
	t.Helper()
	h, err := netns.Handle(NamespaceOf(st.Name, node))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	l, err := h.LinkByName(ifname)
	if err != nil {
		t.Fatalf("%s in %s: %v", ifname, node, err)
	}
	addrs, err := h.AddrList(l, unix.AF_INET)
	if err != nil {
		t.Fatal(err)
	}
	return l, addrs
}

func hasLink(t *testing.T, st *State, node, ifname string) bool {
	t.Helper()
	h, err := netns.Handle(NamespaceOf(st.Name, node))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	_, err = h.LinkByName(ifname)
	var missing netlink.LinkNotFoundError
	if err != nil && !errors.As(err, &missing) {
		t.Fatal(err)
	}
	return err == nil
}

func TestPrivilegedSliverCarriesItsHostsAddressAndMACAndExternalsReachHosts(t *testing.T) {
	testenv.RequireTool(t, "ip", "ping")
	st, f := upBridgeLab(t, portshareBridge)

	// Each sliver's eth<k> is its host's uplink k: same address, same
	// prefix, same MAC; and a connected route to the fabric.
	for _, c := range []struct {
		sliver, host string
		k            int
	}{{"s1", "h1", 0}, {"s2", "h1", 0}, {"s3", "h2", 1}} {
		h, _ := f.HostByName(c.host)
		up, _ := nodeLink(t, st, c.host, topology.UplinkName(c.k))
		eth, addrs := nodeLink(t, st, c.sliver, SliverInterface(c.k))
		want := h.UplinkAddrs[c.k] + "/24"
		if len(addrs) != 1 || addrs[0].IPNet.String() != want {
			t.Errorf("%s's %s has %v, want exactly %s (%s's uplink %d)", c.sliver, eth.Attrs().Name, addrs, want, c.host, c.k)
		}
		if eth.Attrs().HardwareAddr.String() != up.Attrs().HardwareAddr.String() {
			t.Errorf("%s's %s has MAC %s, %s's %s has %s", c.sliver, eth.Attrs().Name, eth.Attrs().HardwareAddr, c.host, up.Attrs().Name, up.Attrs().HardwareAddr)
		}
		sh, err := netns.Handle(NamespaceOf(st.Name, c.sliver))
		if err != nil {
			t.Fatal(err)
		}
		routes, err := sh.RouteList(eth, unix.AF_INET)
		sh.Close()
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(routes, func(r netlink.Route) bool { return r.Dst != nil && r.Dst.String() == "192.168.77.0/24" }) {
			t.Errorf("%s has no connected route to the fabric: %v", c.sliver, routes)
		}
		// Its host-side end is in the host's namespace, and (no datapath
		// to wait for in a bridge lab) up.
		hostEnd, _ := nodeLink(t, st, c.host, intent.SliverIfname(c.sliver, c.k))
		if hostEnd.Attrs().Flags&net.FlagUp == 0 {
			t.Errorf("%s's host end %s is down", c.sliver, hostEnd.Attrs().Name)
		}
	}
	// A sliver has a link only on the uplinks it leases on.
	if hasLink(t, st, "s3", "eth0") || hasLink(t, st, "h2", intent.SliverIfname("s3", 0)) {
		t.Error("s3 leases only on uplink 1, yet has a link on uplink 0")
	}

	// The external reaches every host address over the fabric, and learns
	// each by ARP with the MAC of the uplink that carries it (a host with
	// two uplinks on one subnet answers for each address on its own link
	// only).
	inet, _ := f.ExternalByName("inet")
	if _, addrs := nodeLink(t, st, "inet", ExternalInterface); len(addrs) != 1 || addrs[0].IP.String() != inet.Address {
		t.Fatalf("inet's eth0 has %v, want %s", addrs, inet.Address)
	}
	for _, c := range []struct {
		host string
		k    int
	}{{"h1", 0}, {"h2", 0}, {"h2", 1}} {
		h, _ := f.HostByName(c.host)
		addr := h.UplinkAddrs[c.k]
		up, _ := nodeLink(t, st, c.host, topology.UplinkName(c.k))
		out, err := exec.Command("ip", "netns", "exec", NamespaceOf(st.Name, "inet"), "ping", "-c", "1", "-W", "2", addr).CombinedOutput()
		if err != nil {
			t.Errorf("inet cannot ping %s's uplink %d (%s): %v\n%s", c.host, c.k, addr, err, out)
			continue
		}
		if got := neighbour(t, st, "inet", addr); got != up.Attrs().HardwareAddr.String() {
			t.Errorf("inet resolved %s (%s's %s) to %s, want %s", addr, c.host, up.Attrs().Name, got, up.Attrs().HardwareAddr)
		}
	}

	// What h2 sends from an uplink's address leaves by that uplink.
	h2, _ := f.HostByName("h2")
	hh, err := netns.Handle(NamespaceOf(st.Name, "h2"))
	if err != nil {
		t.Fatal(err)
	}
	defer hh.Close()
	for k, src := range h2.UplinkAddrs {
		routes, err := hh.RouteGetWithOptions(net.ParseIP(inet.Address), &netlink.RouteGetOptions{SrcAddr: net.ParseIP(src)})
		if err != nil || len(routes) != 1 {
			t.Fatalf("route from %s to inet: %v %v", src, routes, err)
		}
		dev, err := hh.LinkByIndex(routes[0].LinkIndex)
		if err != nil {
			t.Fatal(err)
		}
		// Uplink 0's address sits on the bridge of a bridge lab.
		want := map[int]string{0: "br0", 1: "uplink1"}[k]
		if dev.Attrs().Name != want {
			t.Errorf("h2 sends from %s to inet by %s, want %s", src, dev.Attrs().Name, want)
		}
	}

	// lab status lists the new kinds.
	r := Status(context.Background(), st)
	kinds := map[string]string{}
	for _, n := range r.Nodes {
		kinds[n.Name] = n.Kind
		if n.Kind == "sliver" && (n.Sliver == nil || n.Sliver.Name != n.Name || len(n.Sliver.Leases) == 0) {
			t.Errorf("status of %s: sliver %+v", n.Name, n.Sliver)
		}
	}
	if kinds["s1"] != "sliver" || kinds["s3"] != "sliver" || kinds["inet"] != "external" {
		t.Errorf("status kinds %v", kinds)
	}
}

// neighbour is the MAC node's namespace has for addr.
func neighbour(t *testing.T, st *State, node, addr string) string {
	t.Helper()
	h, err := netns.Handle(NamespaceOf(st.Name, node))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	ns, err := h.NeighList(0, unix.AF_INET)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range ns {
		if n.IP.String() == addr {
			return n.HardwareAddr.String()
		}
	}
	return ""
}

// helperEnv tells the test binary, run again as a child, to be a process
// run "in a sliver": ROOT,LAB,SLIVER.
const helperEnv = "ONEHOP_LAB_TEST_JOIN_SLIVER"

// TestHelperJoinSliver is not a test: run as a child with helperEnv set, it
// does what `lab exec SLIVER` does before exec (JoinSliver), prints its
// cgroup, and waits to be killed.
func TestHelperJoinSliver(t *testing.T) {
	v := os.Getenv(helperEnv)
	if v == "" {
		return
	}
	parts := strings.Split(v, ",")
	st, err := Load(parts[0], parts[1])
	if err == nil {
		err = JoinSliver(st, parts[2])
	}
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "0::") {
			fmt.Println(strings.TrimPrefix(l, "0::"))
		}
	}
	time.Sleep(time.Minute)
	os.Exit(0)
}

// inSliver starts the test binary as a process that joins sliver's cgroup
// and returns it once it reports the cgroup it is in.
func inSliver(t *testing.T, st *State, root, sliver string) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperJoinSliver$")
	cmd.Env = append(os.Environ(), helperEnv+"="+root+","+st.Name+","+sliver)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("helper in %s: %v", sliver, err)
	}
	return cmd, strings.TrimSpace(line)
}

func TestPrivilegedSliverProcessesLiveInTheirCgroupAndDieWithTheLab(t *testing.T) {
	st, _ := upBridgeLab(t, portshareBridge)
	root := filepath.Dir(st.Dir)
	cmd, cg := inSliver(t, st, root, "s2")
	if want := "/onehop-" + st.Name + "/h1/s2"; cg != want {
		t.Fatalf("a process run in s2 is in cgroup %q, want %q", cg, want)
	}
	pids, err := cgroupPIDs(SliverCgroupDir(st, "h1", "s2"))
	if err != nil || !slices.Contains(pids, cmd.Process.Pid) {
		t.Fatalf("s2's cgroup holds %v (%v), not the helper %d", pids, err, cmd.Process.Pid)
	}
	if pids, err := cgroupPIDs(SliverCgroupDir(st, "h1", "s1")); err != nil || len(pids) != 0 {
		t.Fatalf("s1's cgroup holds %v (%v)", pids, err)
	}
	// A node that is no sliver is left where it is.
	if err := JoinSliver(st, "h1"); err != nil {
		t.Fatal(err)
	}

	// Lab down kills what runs in a sliver and removes every cgroup and
	// the lab's cgroup2 mount.
	if err := Teardown(st, nil); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != -1 {
			t.Errorf("the process in s2 ended with %v, want killed by a signal", err)
		}
	case <-time.After(5 * time.Second):
		t.Error("the process in s2 outlived lab down")
	}
	if _, err := os.Stat(st.CgroupFS); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the lab's cgroup mount %s is still there (%v)", st.CgroupFS, err)
	}
	if b, err := os.ReadFile("/proc/self/mountinfo"); err != nil || strings.Contains(string(b), st.CgroupFS) {
		t.Errorf("cgroup2 still mounted at %s (%v)", st.CgroupFS, err)
	}
}

func TestPrivilegedAddSliverBuildsItAndRemoveSliverLeavesNothing(t *testing.T) {
	st, _ := upBridgeLab(t, portshareBridge)
	s := intent.Sliver{Host: "h1", Name: "s4", Slot: 4, Leases: []intent.Lease{{Lo: 10200, Hi: 10299}}}
	if err := AddSliver(st, s); err != nil {
		t.Fatal(err)
	}
	// Reloaded, as the next command would see it.
	st2, err := Load(filepath.Dir(st.Dir), st.Name)
	if err != nil {
		t.Fatal(err)
	}
	if st2.Kinds["s4"] != "sliver" || !slices.ContainsFunc(st2.Slivers, func(x intent.Sliver) bool { return x.Name == "s4" && x.Slot == 4 }) {
		t.Fatalf("state after AddSliver: kinds %v slivers %+v", st2.Kinds, st2.Slivers)
	}
	up, _ := nodeLink(t, st2, "h1", HostUplink)
	eth, addrs := nodeLink(t, st2, "s4", "eth0")
	if eth.Attrs().HardwareAddr.String() != up.Attrs().HardwareAddr.String() || len(addrs) != 1 || addrs[0].IP.String() != "192.168.77.10" {
		t.Fatalf("s4's eth0: MAC %s addrs %v; h1's uplink0 MAC %s", eth.Attrs().HardwareAddr, addrs, up.Attrs().HardwareAddr)
	}
	if err := AddSliver(st2, intent.Sliver{Host: "h1", Name: "s4", Leases: s.Leases}); err == nil || !strings.Contains(err.Error(), `already has a node "s4"`) {
		t.Fatalf("adding s4 twice: %v", err)
	}
	if err := AddSliver(st2, intent.Sliver{Host: "h1", Name: "s5", Leases: []intent.Lease{{Uplink: 2, Lo: 1, Hi: 2}}}); err == nil || !strings.Contains(err.Error(), "no uplink2") {
		t.Fatalf("a lease on an uplink h1 lacks: %v", err)
	}
	if netns.Exists(NamespaceOf(st2.Name, "s5")) || st2.Kinds["s5"] != "" {
		t.Fatal("a refused sliver left its namespace or record behind")
	}
	cmd, _ := inSliver(t, st2, filepath.Dir(st2.Dir), "s4")

	if err := RemoveSliver(st2, "h2", "s4"); err == nil || !strings.Contains(err.Error(), "is on host h1") {
		t.Fatalf("removing s4 from the wrong host: %v", err)
	}
	if err := RemoveSliver(st2, "h1", "s4"); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err == nil {
		t.Error("the process in s4 outlived its sliver")
	}
	if netns.Exists(NamespaceOf(st2.Name, "s4")) || hasLink(t, st2, "h1", intent.SliverIfname("s4", 0)) {
		t.Error("s4's namespace or host-side link is left")
	}
	if _, err := os.Stat(SliverCgroupDir(st2, "h1", "s4")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("s4's cgroup is left (%v)", err)
	}
	st3, err := Load(filepath.Dir(st.Dir), st.Name)
	if err != nil {
		t.Fatal(err)
	}
	if st3.Kinds["s4"] != "" || slices.ContainsFunc(st3.Slivers, func(x intent.Sliver) bool { return x.Name == "s4" }) ||
		slices.Contains(st3.Namespaces, NamespaceOf(st.Name, "s4")) {
		t.Errorf("state still knows s4: %+v", st3)
	}
	if err := RemoveSliver(st3, "h1", "s4"); err == nil {
		t.Error("removing s4 twice succeeded")
	}
	// The other slivers are untouched.
	if _, addrs := nodeLink(t, st3, "s1", "eth0"); len(addrs) != 1 {
		t.Errorf("s1 lost its address: %v", addrs)
	}
}

// TestMain removes the onehop binary onehopBinary built.
func TestMain(m *testing.M) {
	code := m.Run()
	if builtBin != "" {
		os.RemoveAll(filepath.Dir(builtBin))
	}
	os.Exit(code)
}
