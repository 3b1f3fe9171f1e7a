package e2e

import (
	"context"
	"crypto/sha512"
	"encoding/json"
	"fmt"
	"math/rand"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/onehop/onehop/internal/cni"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/lab"
	"github.com/onehop/onehop/internal/netns"
	"github.com/onehop/onehop/internal/testenv"
)

// cniHost is one lab host seen as a container runtime sees its host: a
// CNI_PATH with the onehop plugin and a NETCONFPATH with the network
// config (docs/guests.md's), both used by the real cnitool run inside
// the host's namespace, where the agent is.
type cniHost struct {
	l       *testLab
	host    string
	network string
	path    string // CNI_PATH
	confDir string // NETCONFPATH
}

// cniConfig is the network config of docs/guests.md for the lab's API
// over TLS, on host, for farm.
func cniConfig(st *lab.State, network, farm, host string) string {
	return fmt.Sprintf(`{
  "cniVersion": "1.1.0",
  "name": %q,
  "plugins": [{
    "type": "onehop",
    "farm": %q,
    "subnet": "web",
    "api": %q,
    "ca": %q,
    "tokenFile": %q,
    "host": %q,
    "attachTimeout": "10s",
    "dns": {"nameservers": ["10.1.1.1"], "search": ["blue.example"]}
  }]
}
`, network, farm, st.APIURL, lab.CAFile(st), lab.TokenFile(st), host)
}

func newCNIHost(t *testing.T, l *testLab, host, farm string) *cniHost {
	t.Helper()
	st, err := lab.Load(testRoot, l.name)
	if err != nil {
		t.Fatal(err)
	}
	h := &cniHost{l: l, host: host, network: "oh-" + l.name + "-" + farm, path: t.TempDir(), confDir: t.TempDir()}
	if err := os.Symlink(binary, filepath.Join(h.path, "onehop")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(h.confDir, h.network+".conflist"), []byte(cniConfig(st, h.network, farm, host)), 0o644); err != nil {
		t.Fatal(err)
	}
	return h
}

// cnitool runs `cnitool CMD NETWORK NETNS` in the host's namespace.
func (h *cniHost) cnitool(cmd, netnsPath string) (string, error) {
	return h.l.in(h.host, "env", "CNI_PATH="+h.path, "NETCONFPATH="+h.confDir, "CNI_IFNAME=eth0", "cnitool", cmd, h.network, netnsPath)
}

// container is a network namespace standing for a container, removed when
// the test ends.
type container struct {
	name, path string
	id         string // the container id cnitool gives the plugin
	vm         string // its VM's name
}

func newContainer(t *testing.T, name string) *container {
	t.Helper()
	ns := fmt.Sprintf("oh-cni%d-%s", rand.Intn(1_000_000), name)
	if err := netns.Create(ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := netns.Delete(ns); err != nil {
			t.Error(err)
		}
	})
	c := &container{name: name, path: netns.Path(ns)}
	// cnitool's container id is a hash of the namespace's path.
	s := sha512.Sum512([]byte(c.path))
	c.id = fmt.Sprintf("cnitool-%x", s[:10])
	c.vm = cni.VMName(c.id, nil)
	return c
}

// run runs a command inside the container's namespace.
func (c *container) run(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + c.path}, args...)...).CombinedOutput()
	return string(out), err
}

// ping says whether every one of count echo requests to ip was answered.
func (c *container) ping(ip string, count int) error {
	out, err := c.run("ping", "-c", fmt.Sprint(count), "-i", "0.2", "-W", "1", ip)
	if err != nil || !strings.Contains(out, fmt.Sprintf("%d received", count)) {
		return fmt.Errorf("ping %s -> %s: %v\n%s", c.name, ip, err, out)
	}
	return nil
}

// add runs cnitool add for c on h and returns the result, checked against
// the VM's record: address, gateway, MAC, interfaces and DNS.
func (h *cniHost) add(t *testing.T, c *container) cni.Result {
	t.Helper()
	start := time.Now()
	out, err := h.cnitool("add", c.path)
	if err != nil {
		t.Fatalf("cnitool add %s on %s: %v\n%s", c.name, h.host, err, out)
	}
	t.Logf("cnitool add %s on %s (lab exec, cnitool, plugin, agent): %s", c.name, h.host, time.Since(start).Round(time.Millisecond))
	var r cni.Result
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("cnitool add %s: result: %v\n%s", c.name, err, out)
	}
	vm := h.l.vmRecord("blue/web/" + c.vm)
	if vm.Host != h.host || vm.Interface != intent.VifName("blue", c.vm) {
		t.Fatalf("vm %s: host %s interface %s, want %s and %s", c.vm, vm.Host, vm.Interface, h.host, intent.VifName("blue", c.vm))
	}
	if len(r.IPs) != 1 || r.IPs[0].Address != vm.IP+"/24" || r.IPs[0].Gateway != vm.Gateway ||
		len(r.Interfaces) != 2 || r.Interfaces[1].Name != "eth0" || r.Interfaces[1].MAC != vm.MAC || r.Interfaces[1].Sandbox != c.path ||
		r.Interfaces[0].Name != vm.Interface || r.DNS == nil || len(r.DNS.Nameservers) != 1 {
		t.Fatalf("cnitool add %s: result does not match vm %+v:\n%s", c.name, vm, out)
	}
	// ADD returned only once the agent had attached: the program is on
	// the host end, and the host end is up, now.
	hostNS := lab.NamespaceOf(h.l.name, h.host)
	if err := netns.Do(hostNS, func() error {
		l, err := netlink.LinkByName(vm.Interface)
		if err != nil {
			return err
		}
		if l.Attrs().Flags&net.FlagUp == 0 {
			return fmt.Errorf("%s is down", vm.Interface)
		}
		progs, err := link.QueryPrograms(link.QueryOptions{Target: l.Attrs().Index, Attach: ebpf.AttachTCXIngress})
		if err != nil {
			return err
		}
		if len(progs.Programs) == 0 {
			return fmt.Errorf("no tcx program on %s", vm.Interface)
		}
		return nil
	}); err != nil {
		t.Fatalf("right after cnitool add %s returned: %v", c.name, err)
	}
	return r
}

// hostLinks lists the interfaces in host's namespace.
func (l *testLab) hostLinks(host string) string {
	l.t.Helper()
	return l.mustIn(host, "ip", "-br", "link")
}

// vmNames are the names of every VM the controller has.
func (l *testLab) vmNames() string {
	l.t.Helper()
	out, err := l.cli("get", "vms")
	if err != nil {
		l.t.Fatalf("get vms: %v\n%s", err, out)
	}
	return out
}

// TestPrivilegedCNIContainersOnTwoHostsTalkAndLeaveNothingBehind drives the
// plugin with the real cnitool: two containers on two hosts get their
// addresses, reach each other and a lab VM; CHECK passes, and fails once
// the container's address is gone; DEL removes the VM and every link, a
// second DEL and a DEL after the namespace went succeed; an ADD for
// another host times out waiting for the attach; STATUS and an
// ADD with a farm the controller does not have are CNI errors naming the
// farm, and the ADD leaves nothing; GC removes the containers a runtime
// forgot, on its host only.
func TestPrivilegedCNIContainersOnTwoHostsTalkAndLeaveNothingBehind(t *testing.T) {
	testenv.RequireTool(t, "cnitool", "nsenter")
	l := upLab(t, tapGuestLab) // a lab VM on h2; the containers are the test's
	h1, h2 := newCNIHost(t, l, "h1", "blue"), newCNIHost(t, l, "h2", "blue")
	c1, c2 := newContainer(t, "c1"), newContainer(t, "c2")
	// Whatever happens, the VMs go and libcni's cache with them.
	t.Cleanup(func() { h1.cnitool("del", c1.path); h2.cnitool("del", c2.path) })

	r1 := h1.add(t, c1)
	r2 := h2.add(t, c2)
	ip1, ip2 := strings.TrimSuffix(r1.IPs[0].Address, "/24"), strings.TrimSuffix(r2.IPs[0].Address, "/24")
	web2 := l.ip("web2")

	// Across hosts, both ways, and with a lab VM.
	for _, p := range []struct {
		from *container
		to   string
	}{{c1, ip2}, {c2, ip1}, {c1, web2}, {c2, web2}} {
		if err := p.from.ping(p.to, 3); err != nil {
			t.Error(err)
		}
	}
	if err := l.ping("web2", ip1, 3); err != nil {
		t.Error(err)
	}
	if t.Failed() {
		t.FailNow()
	}

	for _, c := range []struct {
		h *cniHost
		c *container
	}{{h1, c1}, {h2, c2}} {
		if out, err := c.h.cnitool("check", c.c.path); err != nil {
			t.Fatalf("cnitool check %s: %v\n%s", c.c.name, err, out)
		}
	}
	// CHECK can fail: the container's address removed behind its back.
	if out, err := c1.run("ip", "addr", "flush", "dev", "eth0"); err != nil {
		t.Fatalf("flush c1's address: %v\n%s", err, out)
	}
	if out, err := h1.cnitool("check", c1.path); err == nil || !strings.Contains(out, "eth0 has no address "+r1.IPs[0].Address) {
		t.Fatalf("cnitool check of c1 without its address: %v, want an error naming the address\n%s", err, out)
	}

	// DEL: the VM leaves the intent, no link is left on the host or in
	// the container; a second DEL succeeds.
	vif1 := intent.VifName("blue", c1.vm)
	for i := 1; i <= 2; i++ {
		if out, err := h1.cnitool("del", c1.path); err != nil {
			t.Fatalf("cnitool del c1 (#%d): %v\n%s", i, err, out)
		}
	}
	if vms := l.vmNames(); strings.Contains(vms, c1.vm) || !strings.Contains(vms, c2.vm) {
		t.Errorf("after DEL of c1, the controller's VMs (want c2's %s, not c1's %s):\n%s", c2.vm, c1.vm, vms)
	}
	if links := l.hostLinks("h1"); strings.Contains(links, vif1) {
		t.Errorf("after DEL, h1 still has %s:\n%s", vif1, links)
	}
	if out, _ := c1.run("ip", "-br", "link"); strings.Contains(out, "eth0") {
		t.Errorf("after DEL, c1 still has eth0:\n%s", out)
	}

	// DEL after the runtime removed the namespace first.
	if err := netns.Delete(filepath.Base(c2.path)); err != nil {
		t.Fatal(err)
	}
	if out, err := h2.cnitool("del", c2.path); err != nil {
		t.Fatalf("cnitool del c2 after its namespace went: %v\n%s", err, out)
	}
	if vms := l.vmNames(); strings.Contains(vms, c2.vm) {
		t.Errorf("after DEL of c2, the controller still has %s:\n%s", c2.vm, vms)
	}
	if links := l.hostLinks("h2"); strings.Contains(links, intent.VifName("blue", c2.vm)) {
		t.Errorf("after DEL, h2 still has %s:\n%s", intent.VifName("blue", c2.vm), links)
	}

	// A config naming another host than the one the plugin runs on: no
	// agent attaches to the veth (h2's has no such link, h1's no such
	// VM), so ADD waits attachTimeout, fails naming the host, and leaves
	// nothing. An ADD that did not wait for the attach would succeed.
	wrong := newCNIHost(t, l, "h1", "blue")
	st, err := lab.Load(testRoot, l.name)
	if err != nil {
		t.Fatal(err)
	}
	conf := strings.Replace(cniConfig(st, wrong.network, "blue", "h2"), `"attachTimeout": "10s"`, `"attachTimeout": "1s"`, 1)
	if err := os.WriteFile(filepath.Join(wrong.confDir, wrong.network+".conflist"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	c4 := newContainer(t, "c4")
	t.Cleanup(func() { wrong.cnitool("del", c4.path) }) // were it added after all
	if out, err := wrong.cnitool("add", c4.path); err == nil || !strings.Contains(out, "host h2's agent did not attach to "+intent.VifName("blue", c4.vm)+" within 1s") {
		t.Fatalf("cnitool add on h1 for host h2: %v, want it to time out naming h2's agent\n%s", err, out)
	}
	if vms := l.vmNames(); strings.Contains(vms, c4.vm) {
		t.Errorf("an ADD that timed out left its VM %s:\n%s", c4.vm, vms)
	}
	if links := l.hostLinks("h1"); strings.Contains(links, intent.VifName("blue", c4.vm)) {
		t.Errorf("an ADD that timed out left %s on h1:\n%s", intent.VifName("blue", c4.vm), links)
	}

	// A farm the controller does not have: a CNI error naming it, and
	// nothing made.
	bad := newCNIHost(t, l, "h1", "nofarm")
	c3 := newContainer(t, "c3")
	if out, err := h1.cnitool("status", c3.path); err != nil {
		t.Errorf("cnitool status on h1: %v\n%s", err, out)
	}
	if out, err := bad.cnitool("status", c3.path); err == nil || !strings.Contains(out, `farm "nofarm"`) {
		t.Errorf("cnitool status with farm nofarm: %v, want it unavailable naming the farm\n%s", err, out)
	}
	out, err := bad.cnitool("add", c3.path)
	if err == nil || !strings.Contains(out, `farm "nofarm": the controller has no such farm`) {
		t.Fatalf("cnitool add with farm nofarm: %v, want an error naming the farm\n%s", err, out)
	}
	// The plugin's own answer, as any runtime reads it: the error object
	// with the code of a bad config.
	confFile := filepath.Join(t.TempDir(), "nofarm.json")
	one := strings.Replace(strings.Replace(cniConfig(st, bad.network, "nofarm", "h1"), `"plugins": [{`, `"type": "onehop",`, 1), "}]\n}", "}", 1)
	if err := os.WriteFile(confFile, []byte(one), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err = l.in("h1", "sh", "-c", fmt.Sprintf("CNI_COMMAND=ADD CNI_CONTAINERID=%s CNI_NETNS=%s CNI_IFNAME=eth0 CNI_PATH=%s %s < %s",
		c3.id, c3.path, bad.path, filepath.Join(bad.path, "onehop"), confFile))
	var e cni.Error
	if err == nil || json.Unmarshal([]byte(out), &e) != nil || e.Code != cni.ErrInvalidConfig || !strings.Contains(e.Msg, `farm "nofarm"`) {
		t.Fatalf("the plugin's ADD with farm nofarm: %v, want the error object with code %d naming the farm:\n%s", err, cni.ErrInvalidConfig, out)
	}
	if out, _ := c3.run("ip", "-br", "link"); strings.Contains(out, "eth0") {
		t.Errorf("a refused ADD left eth0 in the container:\n%s", out)
	}
	if links := l.hostLinks("h1"); strings.Contains(links, intent.VifName("nofarm", c3.vm)) {
		t.Errorf("a refused ADD left %s on h1:\n%s", intent.VifName("nofarm", c3.vm), links)
	}

	// GC: containers whose DEL never came (libcni's cache of them gone, as
	// after a runtime lost its state) are removed by the next GC of their
	// network on their host; another host's is not, nor the lab's VM.
	c5, c6 := newContainer(t, "c5"), newContainer(t, "c6")
	t.Cleanup(func() { h1.cnitool("del", c5.path); h2.cnitool("del", c6.path) })
	h1.add(t, c5)
	h2.add(t, c6)
	for _, c := range []*container{c5, c6} {
		// The lab's hosts share one file system, so one libcni cache: a
		// GC on h1 would DEL h2's cached attachment too.
		cached, _ := filepath.Glob(filepath.Join("/var/lib/cni/results", "*-"+c.id+"-eth0"))
		if len(cached) != 1 {
			t.Fatalf("libcni's cache of %s: %v, want one file", c.name, cached)
		}
		if err := os.Remove(cached[0]); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := h1.cnitool("gc", c5.path); err != nil {
		t.Fatalf("cnitool gc on h1: %v\n%s", err, out)
	}
	vms := l.vmNames()
	if strings.Contains(vms, c5.vm) || !strings.Contains(vms, c6.vm) || !strings.Contains(vms, "web2") {
		t.Errorf("after GC on h1, the controller's VMs (want c6's %s and web2, not c5's %s):\n%s", c6.vm, c5.vm, vms)
	}
	if links := l.hostLinks("h1"); strings.Contains(links, intent.VifName("blue", c5.vm)) {
		t.Errorf("after GC, h1 still has %s:\n%s", intent.VifName("blue", c5.vm), links)
	}
	if out, _ := c5.run("ip", "-br", "link"); strings.Contains(out, "eth0") {
		t.Errorf("after GC, c5 still has eth0:\n%s", out)
	}
	if links := l.hostLinks("h2"); !strings.Contains(links, intent.VifName("blue", c6.vm)) {
		t.Errorf("GC on h1 removed h2's %s:\n%s", intent.VifName("blue", c6.vm), links)
	}
	if err := c6.ping(web2, 2); err != nil {
		t.Errorf("c6 after h1's GC: %v", err)
	}
}
