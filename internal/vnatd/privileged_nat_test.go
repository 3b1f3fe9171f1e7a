package vnatd

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/netns/netnstest"
	"github.com/onehop/onehop/internal/testenv"
)

// The paper's laptop, with the real daemons: a mover (a, the client) and
// its peer (b, an echo server at 10.8.0.2:5001) on two subnets joined by
// a router namespace, which masquerades (nftables) what leaves
// 192.168.7.0/24 towards b; b has a route to a's subnet 10.8.1.0/24 and
// none to 192.168.7.0/24. The control first: a moves within its routed
// subnet (10.8.1.2 → 10.8.1.3) and both ends are migrated, no packet
// masqueraded. Then a moves behind the NAT (→ 192.168.7.2): its update
// names 192.168.7.2, but reaches b from the router's 10.8.0.254, and b
// must translate to 10.8.0.254 (with a's port) for the connection to carry
// on: the echoes go on, the masquerade rule counted them, and b counted
// updates_from_nat. Before the fix b installed 192.168.7.2, which it
// cannot reach, and the connection stalled.
func TestPrivilegedAMoverBehindANATMigrates(t *testing.T) {
	testenv.RequireRoot(t, "network namespaces and BPF")
	testenv.RequireTool(t, "ip", "nft", "go")
	p := &pair{nsA: netnstest.New(t, "vnat-laptop"), nsB: netnstest.New(t, "vnat-peer")}
	nsN := netnstest.New(t, "vnat-nat")
	netnstest.Veth(t, "a0", p.nsA, "na", nsN)
	netnstest.Veth(t, "b0", p.nsB, "nb", nsN)
	netnstest.IP(t, nsN, "addr", "add", "10.8.1.254/24", "dev", "na")
	netnstest.IP(t, nsN, "addr", "add", "192.168.7.254/24", "dev", "na")
	netnstest.IP(t, nsN, "addr", "add", "10.8.0.254/24", "dev", "nb")
	inNS(t, nsN, "", "sysctl", "-qw", "net.ipv4.ip_forward=1")
	inNS(t, nsN, `table ip onehop {
	chain post {
		type nat hook postrouting priority srcnat; policy accept;
		ip saddr 192.168.7.0/24 oifname "nb" counter masquerade
	}
}
`, "nft", "-f", "-")
	netnstest.IP(t, p.nsA, "addr", "add", "10.8.1.2/24", "dev", "a0")
	netnstest.IP(t, p.nsA, "route", "add", "default", "via", "10.8.1.254")
	netnstest.IP(t, p.nsB, "addr", "add", "10.8.0.2/24", "dev", "b0")
	netnstest.IP(t, p.nsB, "route", "add", "10.8.1.0/24", "via", "10.8.0.254")
	p.bin, p.dir = netnstest.Onehop(t), t.TempDir()
	p.a = &daemonProc{ns: p.nsA, iface: "a0", sock: filepath.Join(p.dir, p.nsA+".sock"), logs: &testenv.Buffer{}}
	p.b = &daemonProc{ns: p.nsB, iface: "b0", sock: filepath.Join(p.dir, p.nsB+".sock"), logs: &testenv.Buffer{}}
	p.start(t, p.a)
	p.start(t, p.b)

	c, echo := p.keyedEcho(t)
	virtA, virtB := p.virtual(c)
	port := localPort(c)
	echoes := func(what string) {
		t.Helper()
		for range 5 {
			if err := echo(what); err != nil {
				t.Fatalf("%s: %v\n%s\n---\n%s", what, err, p.a.logs, p.b.logs)
			}
		}
	}
	// moveA gives a another address, then its way out, as a laptop that
	// joined another network sees it.
	moveA := func(from, to, router string) {
		netnstest.IP(t, p.nsA, "addr", "del", from, "dev", "a0")
		netnstest.IP(t, p.nsA, "addr", "add", to, "dev", "a0")
		netnstest.IP(t, p.nsA, "route", "replace", "default", "via", router)
	}

	// The control: a moves within its routed subnet.
	moveA("10.8.1.2/24", "10.8.1.3/24", "10.8.1.254")
	p.waitMigrated(t, virtA, virtB, "10.8.1.3"+port, "10.8.0.2:5001", 20*time.Second)
	echoes("after a moved within its subnet")
	if n := masqueraded(t, nsN); n != 0 {
		t.Fatalf("the control: %d packets masqueraded, want none", n)
	}

	// Behind the NAT.
	moveA("10.8.1.3/24", "192.168.7.2/24", "192.168.7.254")
	// a sees itself at its private address; b sees it at the router's.
	waitStatus(t, p.a.sock, virtA, 20*time.Second, func(s ConnStatus) bool {
		return s.State == "migrated" && s.Physical == "192.168.7.2"+port+"->10.8.0.2:5001"
	}, p.a.logs, p.b.logs)
	waitStatus(t, p.b.sock, virtB, 5*time.Second, func(s ConnStatus) bool {
		return s.State == "migrated" && s.Physical == "10.8.0.2:5001->10.8.0.254"+port
	}, p.a.logs, p.b.logs)
	echoes("after a moved behind the NAT")
	// A nat chain sees only a connection's first packet: the rule counts
	// once per conntrack entry, which the update itself may have made
	// before the echoes. The control above counted none.
	if n := masqueraded(t, nsN); n == 0 {
		t.Errorf("the echoes behind the NAT: no packet masqueraded, want the router to have translated a's traffic")
	}
	st, err := Ask(p.b.sock, Request{Op: "status"})
	if err != nil {
		t.Fatal(err)
	}
	if st.Counters["updates_from_nat"] != 1 || st.Counters["updates_applied"] != 2 {
		t.Errorf("b's counters %v: want 2 updates applied, 1 of them from a NAT", st.Counters)
	}
}

// inNS runs a command in namespace ns (`ip netns exec`), stdin given, and
// fails t with its output if it fails.
func inNS(t *testing.T, ns, stdin string, args ...string) {
	t.Helper()
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("in %s: %s: %v: %s", ns, strings.Join(args, " "), err, out)
	}
}

var packetsRe = regexp.MustCompile(`counter packets (\d+)`)

// masqueraded is the packet count of the masquerade rule in ns.
func masqueraded(t *testing.T, ns string) uint64 {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", ns, "nft", "list", "chain", "ip", "onehop", "post").CombinedOutput()
	if err != nil {
		t.Fatalf("nft list in %s: %v: %s", ns, err, out)
	}
	m := packetsRe.FindSubmatch(out)
	if m == nil {
		t.Fatalf("no counter in %s's masquerade rule:\n%s", ns, out)
	}
	n, err := strconv.ParseUint(string(m[1]), 10, 64)
	if err != nil {
		t.Fatal(fmt.Errorf("masquerade counter %q: %w", m[1], err))
	}
	return n
}
