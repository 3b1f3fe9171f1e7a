package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/testenv"
)

// Two tenants on one host: web1 floods the slow path, red1 boots by DHCP.
const floodTopology = `name: %s
hosts: [{name: h1}, {name: h2}]
farms:
  - name: blue
    subnets: [{name: web}]
  - name: red
    subnets: [{name: web}]
vms:
  - {name: web1, host: h1, subnet: blue/web}
  - {name: red1, host: h1, subnet: red/web, dhcp: true}
`

// dhcpFlood sends DHCP DISCOVERs (BOOTREQUEST from the VM's own MAC, as a
// client does) as fast as a VM can for the given seconds: each one is a
// request the datapath hands to the agent and the agent answers.
const dhcpFlood = `import socket,struct,sys,time
mac=bytes.fromhex(open("/sys/class/net/eth0/address").read().strip().replace(":",""))
s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET,socket.SO_BROADCAST,1)
s.setsockopt(socket.SOL_SOCKET,socket.SO_BINDTODEVICE,b"eth0")
s.bind(("0.0.0.0",68))
end=time.time()+float(sys.argv[1]); n=0
while time.time()<end:
    m=struct.pack("!BBBBIHH4s4s4s4s16s192s4s",1,1,6,0,n,0,0x8000,b"\0"*4,b"\0"*4,b"\0"*4,b"\0"*4,mac+b"\0"*10,b"\0"*192,b"\x63\x82\x53\x63")+b"\x35\x01\x01\xff"
    try:
        s.sendto(m,("255.255.255.255",67)); n+=1
    except OSError:
        pass
print(n)`

func TestPrivilegedADHCPFloodFromOneVMNeitherDeniesDHCPToAnotherTenantNorFillsTheLog(t *testing.T) {
	testenv.RequireTool(t, "udhcpc")
	l := upLab(t, floodTopology)
	logFile := filepath.Join(testRoot, l.name, "agent-h1.log")
	logBefore := fileSize(t, logFile)
	before := l.metrics("h1")

	flood := l.start("web1", "python3", "-c", dhcpFlood, "12")
	// Let the flood fill whatever it can fill before red1 asks.
	testenv.Eventually(t, "the flood to reach h1's slow path", 10*time.Second, func() bool {
		return rise(before, l.metrics("h1"), forwards("to_agent")) > 50
	})

	dir := t.TempDir()
	script := filepath.Join(dir, "udhcpc.sh")
	leaseFile := filepath.Join(dir, "lease")
	if err := os.WriteFile(script, []byte(udhcpcScript), 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := l.in("red1", "env", "LEASE_FILE="+leaseFile, "udhcpc", "-i", "eth0", "-n", "-q", "-f", "-t", "4", "-T", "1", "-s", script)
	if err != nil {
		t.Fatalf("red1 got no DHCP answer while web1 flooded: %v\n%s", err, out)
	}
	lease, err := os.ReadFile(leaseFile)
	if err != nil {
		t.Fatal(err)
	}
	if want := "ip=" + l.ip("red1") + " "; !strings.Contains(string(lease), want) {
		t.Fatalf("red1's lease %q lacks %q", lease, want)
	}
	select {
	case <-flood.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("the flood did not end: %s", flood.Stop())
	}
	sent := strings.TrimSpace(flood.Output())
	var n int
	if _, err := fmt.Sscan(sent, &n); err != nil || n < 1000 {
		t.Fatalf("the flood sent %q datagrams; want thousands for the test to mean anything", sent)
	}

	after := l.metrics("h1")
	overShare, ok := after.lookup(drops("over_share"))
	if !ok {
		t.Fatal("h1 has no over_share drop counter")
	}
	if overShare-before.at(drops("over_share")) < float64(n)/2 {
		t.Errorf("of %d flood datagrams only %v were refused in the kernel as over_share", n, overShare-before.at(drops("over_share")))
	}
	refused := `onehop_vm_refused_total{vm="blue/web/web1",what="punts"}`
	if after.at(refused) < 1 {
		t.Errorf("web1's refusals are not counted per VM (%s = %v)", refused, after.at(refused))
	}
	for k, v := range after.m {
		if strings.HasPrefix(k, "onehop_vm_refused_total{vm=\"red/") && v > 0 {
			t.Errorf("red1 was refused something: %s = %v", k, v)
		}
	}
	// ~200 MB in 10 s before the log was budgeted; a few lines a second now.
	if grew := fileSize(t, logFile) - logBefore; grew > 256*1024 {
		t.Errorf("h1's agent log grew by %d bytes during a %d-datagram flood", grew, n)
	}
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatalf("agent log: %v", err)
	}
	return st.Size()
}
