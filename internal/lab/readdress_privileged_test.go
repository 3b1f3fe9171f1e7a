package lab

import (
	"bufio"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/onehop/onehop/internal/netns"
	"github.com/onehop/onehop/internal/testenv"
)

// externalsBridge is a bridge lab (plumbing only) with one host, a VNAT
// external and a plain one: h1 is .10, inet .11, peer .12.
const externalsBridge = `name: %s
datapath: bridge
fabric: {cidr: 192.168.78.0/24}
hosts: [{name: h1}]
externals:
  - {name: inet, vnat: true}
  - {name: peer}
`

// inNode starts cmd in node's namespace and returns it once it has printed
// its first line (which it returns too).
func inNode(t *testing.T, st *State, node string, cmd ...string) (*exec.Cmd, string) {
	t.Helper()
	c := exec.Command("ip", append([]string{"netns", "exec", NamespaceOf(st.Name, node)}, cmd...)...)
	c.Stderr = os.Stderr
	out, err := c.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Process.Kill(); c.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("%s in %s printed no line: %v", strings.Join(cmd, " "), node, err)
	}
	return c, strings.TrimSpace(line)
}

// echoServer listens on every address of its node, TCP port 7000, and
// answers each connection with its own pid: a process with a socket that
// must outlive its node's change of address.
const echoServer = `
import os, socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 7000)); s.listen(8)
print("listening", flush=True)
while True:
    c, _ = s.accept(); c.sendall(b"pid %d\n" % os.getpid()); c.close()
`

func TestPrivilegedReaddressedExternalGetsAFreshAddressAndKeepsItsProcesses(t *testing.T) {
	testenv.RequireTool(t, "ip", "ping", "python3")
	st, _ := upBridgeLab(t, externalsBridge)
	server, _ := inNode(t, st, "inet", "python3", "-c", echoServer)
	ask := func(addr string) (string, error) {
		out, err := exec.Command("ip", "netns", "exec", NamespaceOf(st.Name, "peer"), "python3", "-c",
			`import socket,sys; c=socket.create_connection((sys.argv[1],7000),timeout=3); print(c.recv(64).decode().strip())`, addr).CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	if out, err := ask("192.168.78.11"); err != nil || out == "" {
		t.Fatalf("peer cannot reach inet's server before the readdress: %v %s", err, out)
	}
	pid := server.Process.Pid
	serverNet, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/ns/net")
	if err != nil {
		t.Fatal(err)
	}

	// inet (.11) gets the first address nobody has: .13.
	old, fresh, err := Readdress(st, "inet")
	if err != nil {
		t.Fatal(err)
	}
	if old.String() != "192.168.78.11/24" || fresh.String() != "192.168.78.13/24" {
		t.Fatalf("readdress: %s -> %s, want 192.168.78.11/24 -> 192.168.78.13/24", old, fresh)
	}
	if _, addrs := nodeLink(t, st, "inet", ExternalInterface); len(addrs) != 1 || addrs[0].IPNet.String() != "192.168.78.13/24" {
		t.Fatalf("inet's eth0 holds %v, want exactly 192.168.78.13/24 (the old address off)", addrs)
	}
	// The server process, started before, is still there, in the same
	// namespace, and its listening socket answers on the new address.
	if err := server.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("inet's server died across the readdress: %v", err)
	}
	if n, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/ns/net"); err != nil || n != serverNet {
		t.Fatalf("inet's server is in namespace %s now (%v), was %s", n, err, serverNet)
	}
	out, err := ask("192.168.78.13")
	if err != nil || out != "pid "+strconv.Itoa(pid) {
		t.Fatalf("inet's server on its new address answered %q (%v), want pid %d", out, err, pid)
	}
	// Nobody answers on the old address any more (the new one just did,
	// over the same path).
	if out, err := exec.Command("ip", "netns", "exec", NamespaceOf(st.Name, "peer"), "ping", "-c", "1", "-W", "1", "192.168.78.11").CombinedOutput(); err == nil {
		t.Errorf("the old address 192.168.78.11 still answers:\n%s", out)
	}

	// Addresses are never handed out twice: inet again, then peer, get
	// ones neither had before (.11 was inet's, .13 too).
	if _, fresh, err := Readdress(st, "inet"); err != nil || fresh.Addr().String() != "192.168.78.14" {
		t.Fatalf("second readdress of inet: %s (%v), want 192.168.78.14", fresh, err)
	}
	if old, fresh, err := Readdress(st, "peer"); err != nil || old.Addr().String() != "192.168.78.12" || fresh.Addr().String() != "192.168.78.15" {
		t.Fatalf("readdress of peer: %s -> %s (%v), want .12 -> .15", old, fresh, err)
	}
	saved, err := Load(st.Dir[:strings.LastIndexByte(st.Dir, '/')], st.Name)
	if err != nil {
		t.Fatal(err)
	}
	if h := saved.Readdressed["inet"]; !slices.Equal(h, []string{"192.168.78.11", "192.168.78.13", "192.168.78.14"}) {
		t.Errorf("inet's recorded addresses %v", h)
	}
	if out, err := ask("192.168.78.14"); err != nil || out != "pid "+strconv.Itoa(pid) {
		t.Errorf("inet's server after a second readdress (asked from peer's new address): %q (%v)", out, err)
	}
	if !netns.Exists(NamespaceOf(st.Name, "inet")) {
		t.Fatal("inet's namespace is gone")
	}
}
