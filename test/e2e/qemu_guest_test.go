package e2e

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/lab"
	"github.com/onehop/onehop/internal/netns"
	"github.com/onehop/onehop/internal/testenv"
)

// qemuGuestLab has web1 on h1 (the control client) and web2 on h2 (the
// server); the QEMU guest on h1 is created through the API by the test.
const qemuGuestLab = `name: %s
hosts: [{name: h1}, {name: h2}]
farms:
  - name: blue
    subnets: [{name: web}]
vms:
  - {name: web1, host: h1, subnet: blue/web}
  - {name: web2, host: h2, subnet: blue/web}
`

// lineServer accepts TCP connections on a port, prints "got PEER LINE"
// for the first line each client sends and answers "reply to LINE".
const lineServer = `
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(8)
while True:
    c, a = s.accept(); c.settimeout(10)
    line = c.makefile().readline().strip()
    print("got", a[0], line, flush=True)
    c.sendall(("reply to " + line + "\n").encode()); c.close()
`

// lineClient sends one line to a lineServer and prints its answer.
const lineClient = `
import socket, sys
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
c.sendall((sys.argv[3] + "\n").encode())
print(c.makefile().readline().strip())
`

func TestPrivilegedQEMUGuestOnATapGetsItsAddressByDHCPAndTalksTCPToALabVMOnAnotherHost(t *testing.T) {
	testenv.RequireTool(t, "qemu-system-x86_64", "cpio")
	k := findGuestKernel(t)
	l := upLab(t, qemuGuestLab)
	const tapName, port = "tapq1", 7400
	if out, err := l.cli("vm", "create", "blue/web/qemu1", "--host", "h1", "--interface", tapName); err != nil {
		t.Fatalf("vm create --interface %s: %v\n%s", tapName, err, out)
	}
	vm := l.vmRecord("blue/web/qemu1")
	guestIP := netip.MustParseAddr(vm.IP)
	web1, web2 := l.ip("web1"), l.ip("web2")

	// web2 (on h2) serves; web1 (on h1, the guest's host) is the positive
	// control: the server answers a lab VM and the test reads what it got.
	server := l.start("web2", "python3", "-c", lineServer, fmt.Sprint(port))
	l.waitListening("web2", "tcp", port)
	if out := l.mustIn("web1", "python3", "-c", lineClient, web2, fmt.Sprint(port), "control from web1"); !strings.Contains(out, "reply to control from web1") {
		t.Fatalf("control: web1 got %q from web2's server, want its reply", out)
	}
	testenv.Eventually(t, "web2's server to log the control", 5*time.Second, func() error {
		if want := "got " + web1 + " control from web1"; !strings.Contains(server.Output(), want) {
			return fmt.Errorf("no %q in:\n%s", want, server.Output())
		}
		return nil
	})

	// The guest: DHCP for its address (nothing else gives it one), then one
	// line to web2 over TCP and web2's answer back.
	const hello = "hello from qemu1"
	initrd := buildInitramfs(t, k, fmt.Sprintf(`
if udhcpc -i eth0 -f -q -n -t 30 -T 1 -s /bin/onehop-dhcp; then
	ip -4 -o addr show dev eth0 | sed 's/^/%[1]saddr /'
	reply=$(echo "%[2]s" | nc -w 10 %[3]s %[4]d)
	echo "%[1]stcp reply=$reply"
else
	echo "%[1]sno lease"
fi`, guestMarker, hello, web2, port))

	start := time.Now()
	qemu := l.start("h1", qemuArgs(k, initrd, tapName, vm.MAC)...)
	// Runs before l.start's cleanup stops QEMU: the console as it stood.
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("QEMU's console:\n%s", qemu.Output())
		}
	})
	at := map[string]time.Duration{}
	awaitGuest := func(what, prefix string, timeout time.Duration) string {
		t.Helper()
		var line string
		testenv.Eventually(t, "the guest to print "+what, timeout, func() error {
			exited := false
			select {
			case <-qemu.done:
				exited = true // what it printed is all there is
			default:
			}
			console := qemu.Output()
			if exited {
				console += "\n" // nothing more is coming: its last line is whole
			}
			lines := guestLines(console)
			if i := slices.IndexFunc(lines, func(s string) bool { return strings.HasPrefix(s, prefix) }); i >= 0 {
				line = lines[i]
				return nil
			}
			if exited {
				t.Fatalf("QEMU exited before the guest printed %s (its console is logged below)", what)
			}
			return fmt.Errorf("no %q on its console yet (the console is logged below)", guestMarker+prefix)
		})
		at[what] = time.Since(start)
		return line
	}

	// The console is live: /init's first line.
	awaitGuest("init", "init", 45*time.Second)
	l.awaitVifKind("h1", "tap", tapName)

	// (1) Its address came by DHCP from its host, and it is intent's.
	lease := awaitGuest("lease", "lease ", 40*time.Second)
	if want := "lease ip=" + guestIP.String() + " "; !strings.HasPrefix(lease, want) {
		t.Fatalf("the guest's lease is %q, want %q (qemu1's address in intent)", lease, want)
	}
	if !strings.Contains(lease, "router="+vm.Gateway) {
		t.Errorf("the guest's lease %q has no router=%s (qemu1's gateway)", lease, vm.Gateway)
	}
	if addr := awaitGuest("address", "addr ", 10*time.Second); !strings.Contains(addr, "inet "+guestIP.String()+"/") {
		t.Errorf("eth0 in the guest has %q, want %s", addr, guestIP)
	}

	// (2) TCP both ways: web2 got the guest's line from the guest's
	// address, and the guest got web2's answer.
	reply := awaitGuest("TCP reply", "tcp reply=", 30*time.Second)
	if want := "tcp reply=reply to " + hello; reply != want {
		t.Errorf("the guest printed %q, want %q", reply, want)
	}
	if want := "got " + guestIP.String() + " " + hello; !strings.Contains(server.Output(), want) {
		t.Errorf("web2's server has no %q:\n%s", want, server.Output())
	}

	// (3) The guest powers off and QEMU exits by itself; its tap goes with it.
	select {
	case <-qemu.done:
	case <-time.After(30 * time.Second):
		t.Error("QEMU did not exit within 30 s of the guest's last line (its console is logged below)")
	}
	at["QEMU exited"] = time.Since(start)
	h, err := netns.Handle(lab.NamespaceOf(l.name, "h1"))
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if _, err := h.LinkByName(tapName); err == nil {
		t.Errorf("%s is still on h1 after QEMU exited", tapName)
	}
	t.Logf("from QEMU's start: /init %v, DHCP lease %v, TCP reply %v, QEMU exited %v",
		at["init"].Round(10*time.Millisecond), at["lease"].Round(10*time.Millisecond),
		at["TCP reply"].Round(10*time.Millisecond), at["QEMU exited"].Round(10*time.Millisecond))
}
