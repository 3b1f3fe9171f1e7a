package e2e

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/testenv"
)

// North-south egress (issue 22): VMs reach inet, a plain machine on the
// fabric, through slices of their own hosts' addresses.

const egressLab = `name: %s
hosts:
  - name: h1
  - name: h2
farms:
  - name: blue
    subnets:
      - name: web
      - {name: quiet, egress: false}
    egress: {to: "0.0.0.0/0", slice: "64"}
  - name: red
    subnets:
      - name: app
vms:
  - {name: web1, host: h1, subnet: blue/web}
  - {name: web2, host: h2, subnet: blue/web}
  - {name: app1, host: h1, subnet: red/app}
  - {name: web3, host: h1, subnet: blue/quiet}
externals:
  - {name: inet}
`

// slices are the egress slices of the lab's VMs, by VM name, from the
// controller (onehop get vms -o json).
func (l *testLab) slices() map[string]intent.Lease {
	l.t.Helper()
	out, err := l.cli("get", "vms", "-o", "json")
	if err != nil {
		l.t.Fatalf("get vms: %v\n%s", err, out)
	}
	var vms []intent.VM
	if err := json.Unmarshal([]byte(out), &vms); err != nil {
		l.t.Fatalf("get vms -o json: %v\n%s", err, out)
	}
	got := map[string]intent.Lease{}
	for _, v := range vms {
		if v.Egress != nil {
			got[v.Name] = v.Egress.Slice
		}
	}
	return got
}

func TestPrivilegedVMsOnTwoHostsReachInetThroughTheirOwnHostsSlices(t *testing.T) {
	testenv.RequireTool(t, "curl", "iperf3", "tcpdump", "tshark")
	l := upLab(t, egressLab)
	inet := l.addr("inet", "eth0")
	h1, h2 := l.addr("h1", "uplink0"), l.addr("h2", "uplink0")
	sl := l.slices()
	if sl["web1"].Hi-sl["web1"].Lo+1 != 64 || sl["web2"].Hi-sl["web2"].Lo+1 != 64 {
		t.Fatalf("slices %+v: want 64 ports for web1 and web2", sl)
	}
	if _, ok := sl["app1"]; ok {
		t.Fatalf("app1 of red (egress off) has a slice: %+v", sl)
	}
	if _, ok := sl["web3"]; ok {
		t.Fatalf("web3 of blue/quiet (egress off there, on in its farm) has a slice: %+v", sl)
	}
	if out, _ := l.cli("get", "vms"); !strings.Contains(out, fmt.Sprintf("slice %d-%d", sl["web1"].Lo, sl["web1"].Hi)) {
		t.Errorf("get vms does not show web1's slice:\n%s", out)
	}

	l.start("inet", "python3", "-m", "http.server", "8080", "--bind", inet)
	l.waitListening("inet", "tcp", 8080)
	l.start("inet", "iperf3", "-s", "-p", "5201")
	l.waitListening("inet", "tcp", 5201)
	stop, _ := l.captureFile("inet", "eth0", "ip.src", "ip.dst", "tcp.srcport", "tcp.dstport")

	testenv.Eventually(t, "web1 fetches from inet", 20*time.Second, func() bool {
		_, err := l.in("web1", "curl", "-sf", "-m", "2", "-o", "/dev/null", "http://"+inet+":8080/")
		return err == nil
	})
	for _, vm := range []string{"web1", "web2"} {
		if out, err := l.in(vm, "curl", "-sf", "-m", "5", "http://"+inet+":8080/"); err != nil || !strings.Contains(out, "Directory listing") {
			t.Fatalf("%s: curl http://%s:8080/: %v\n%s", vm, inet, err, out)
		}
	}
	if out, err := l.in("web1", "iperf3", "-c", inet, "-p", "5201", "-t", "1", "-C", "cubic"); err != nil {
		t.Fatalf("web1: iperf3 to inet: %v\n%s", err, out)
	}
	// A farm without egress reaches nothing outside.
	if out, err := l.in("app1", "curl", "-sf", "-m", "2", "http://"+inet+":8080/"); err == nil {
		t.Fatalf("app1 (red, egress off) fetched from inet:\n%s", out)
	}
	// Nor does a subnet whose own setting is off, in a farm with egress,
	// beside its sibling web, which does (above).
	before := l.metrics("h1").at(drops("no_route"))
	if out, err := l.in("web3", "curl", "-sf", "-m", "2", "http://"+inet+":8080/"); err == nil {
		t.Fatalf("web3 (blue/quiet, egress off there) fetched from inet:\n%s", out)
	}

	// inet saw only the hosts' addresses, each from ports of its own VM's
	// slice; and it saw both (the capture was live).
	seen := map[string]int{}
	for _, line := range stop() {
		f := strings.Split(line, "\t")
		if len(f) < 4 || f[1] != inet || (f[3] != "8080" && f[3] != "5201") {
			continue
		}
		port, _ := strconv.Atoi(f[2])
		switch f[0] {
		case h1:
			if port < int(sl["web1"].Lo) || port > int(sl["web1"].Hi) {
				t.Errorf("from h1's address with port %d, outside web1's slice %+v", port, sl["web1"])
			}
		case h2:
			if port < int(sl["web2"].Lo) || port > int(sl["web2"].Hi) {
				t.Errorf("from h2's address with port %d, outside web2's slice %+v", port, sl["web2"])
			}
		default:
			t.Errorf("inet saw %s from %s: neither host's address", line, f[0])
		}
		seen[f[0]]++
	}
	if seen[h1] == 0 || seen[h2] == 0 {
		t.Fatalf("inet's capture saw h1 %d and h2 %d packets: want both (was the capture live?)", seen[h1], seen[h2])
	}
	m := l.metrics("h1")
	if v := m.at(drops("no_route")); v <= before {
		t.Errorf("web3's packets to inet were not counted as no_route on h1: %v before its curl, %v after", before, v)
	}
	if v, ok := m.lookup(`onehop_egress_flows_total{vm="blue/quiet/web3"}`); ok && v != 0 {
		t.Errorf("web3 (egress off in its subnet) has %v egress flows on h1's /metrics", v)
	}
	if v := m.at(`onehop_egress_flows_total{vm="blue/web/web1"}`); v < 2 {
		t.Errorf("web1's egress flows on h1's /metrics: %v, want the curls' and iperf3's", v)
	}
	if v := m.at(drops("no_route")); v < 1 {
		t.Errorf("app1's packets to inet were not counted as no_route on h1: %v", v)
	}
	if out, err := l.cli("stats"); err != nil || !strings.Contains(out, "egress blue/web/web1") {
		t.Errorf("onehop stats shows no egress line for web1: %v\n%s", err, out)
	}
}

// churnClient opens TCP connections to ip:port from threads as fast as it
// can for secs seconds and prints how many were made and how many failed.
const churnClient = `import socket,sys,threading,time
ip,port,secs=sys.argv[1],int(sys.argv[2]),float(sys.argv[3])
ok=[0];bad=[0];lock=threading.Lock();end=time.time()+secs
def run():
    while time.time()<end:
        try:
            s=socket.create_connection((ip,port),timeout=0.5); s.close(); r=ok
        except OSError: r=bad
        with lock: r[0]+=1
ts=[threading.Thread(target=run) for _ in range(16)]
[t.start() for t in ts]; [t.join() for t in ts]
print(ok[0],bad[0])
`

// holdClient holds n long connections to ip:port, opens a new one every
// 0.25 s for secs seconds, then checks every long one still echoes; it
// prints the long ones lost and the new ones that failed.
const holdClient = `import socket,sys,time
ip,port,n,secs=sys.argv[1],int(sys.argv[2]),int(sys.argv[3]),float(sys.argv[4])
long=[socket.create_connection((ip,port),timeout=5) for _ in range(n)]
print("holding",n,flush=True)
failed=0;made=0;end=time.time()+secs
while time.time()<end:
    try:
        s=socket.create_connection((ip,port),timeout=3); s.sendall(b"x"); s.recv(1); s.close(); made+=1
    except OSError: failed+=1
    time.sleep(0.25)
lost=0
for s in long:
    try:
        s.sendall(b"y")
        if s.recv(1)!=b"y": lost+=1
    except OSError: lost+=1
print("lost",lost,"failed",failed,"made",made)
`

// churnEchoServer echoes bytes on port, a thread per connection, with room
// for a flood of connections in its backlog.
const churnEchoServer = `import socket,sys,threading
s=socket.socket(); s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)
s.bind(("",int(sys.argv[1]))); s.listen(4096)
def serve(c):
    try:
        while True:
            d=c.recv(4096)
            if not d: break
            c.sendall(d)
    except OSError: pass
    c.close()
while True:
    c,_=s.accept(); threading.Thread(target=serve,args=(c,),daemon=True).start()
`

const churnLab = `name: %s
hosts:
  - name: h1
farms:
  - name: blue
    subnets:
      - name: web
    egress: {slice: "256"}
vms:
  - {name: vma, host: h1, subnet: blue/web}
  - {name: vmb, host: h1, subnet: blue/web}
externals:
  - {name: inet}
`

// The churn test: one VM exhausting its own slice never costs another VM
// of the same host (the same address) a connection.
func TestPrivilegedAVMExhaustingItsSliceCostsAnotherVMNothing(t *testing.T) {
	l := upLab(t, churnLab)
	inet := l.addr("inet", "eth0")
	l.start("inet", "python3", "-c", churnEchoServer, "7000")
	l.waitListening("inet", "tcp", 7000)
	testenv.Eventually(t, "vmb reaches inet", 20*time.Second, func() bool {
		_, err := l.in("vmb", "python3", "-c", "import socket,sys; socket.create_connection((sys.argv[1],7000),timeout=1).close()", inet)
		return err == nil
	})
	hold := l.start("vmb", "python3", "-c", holdClient, inet, "7000", "100", "20")
	testenv.Eventually(t, "vmb holds 100 connections", 20*time.Second, func() bool {
		return strings.Contains(hold.Output(), "holding 100")
	})
	churn := l.mustIn("vma", "python3", "-c", churnClient, inet, "7000", "20")
	testenv.Eventually(t, "vmb's report", 30*time.Second, func() bool {
		return strings.Contains(hold.Output(), "lost ")
	})
	var lost, failed, made int
	if _, err := fmt.Sscanf(hold.Output()[strings.Index(hold.Output(), "lost "):], "lost %d failed %d made %d", &lost, &failed, &made); err != nil {
		t.Fatalf("vmb's report %q: %v", hold.Output(), err)
	}
	var ok, bad int
	if _, err := fmt.Sscanf(strings.TrimSpace(churn), "%d %d", &ok, &bad); err != nil {
		t.Fatalf("vma's report %q: %v", churn, err)
	}
	t.Logf("vma: %d connections made, %d failed; vmb: %d lost, %d new failed, %d new made", ok, bad, lost, failed, made)
	if lost != 0 || failed != 0 || made < 40 {
		t.Errorf("vmb lost %d of its 100 connections and %d of its %d new ones failed: want none", lost, failed, failed+made)
	}
	if ok < 256 || bad == 0 {
		t.Errorf("vma made %d and was refused %d: want its whole slice (256) used, then refusals", ok, bad)
	}
	m := l.metrics("h1")
	if v := m.at(`onehop_egress_refused_total{vm="blue/web/vma"}`); v == 0 {
		t.Errorf("vma's refusals are not counted for vma")
	}
	if v := m.at(`onehop_egress_refused_total{vm="blue/web/vmb"}`); v != 0 {
		t.Errorf("vmb was refused %v new flows: its slice is its own", v)
	}
}
