package e2e

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

const scopes = `name: %s
hosts: [{name: h1}, {name: h2}]
farms:
  - name: blue
    subnets: [{name: web}, {name: db}]
    rules: [{from: web, to: db, proto: udp}]
  - name: red
    subnets: [{name: web}]
vms:
  - {name: web1, host: h1, subnet: blue/web}
  - {name: web2, host: h2, subnet: blue/web}
  - {name: web3, host: h1, subnet: blue/web}
  - {name: db1, host: h2, subnet: blue/db}
  - {name: db2, host: h1, subnet: blue/db}
  - {name: red1, host: h2, subnet: red/web}
`

// sendUDP sends one datagram from a VM with the given destination and TTL
// (python3 from the machine, run inside the VM's namespace).
func (l *testLab) sendUDP(vm, dst string, ttl int, payload string) {
	l.t.Helper()
	script := `import socket,sys
s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET,socket.SO_BROADCAST,1)
s.setsockopt(socket.IPPROTO_IP,socket.IP_MULTICAST_TTL,int(sys.argv[2]))
s.setsockopt(socket.IPPROTO_IP,socket.IP_TTL,int(sys.argv[2]))
s.sendto(sys.argv[3].encode(),(sys.argv[1],9999))`
	l.mustIn(vm, "python3", "-c", script, dst, strconv.Itoa(ttl), payload)
}

func TestPrivilegedBroadcastAndMulticastReachTheirScopeOnAnyHostAndNoOneElse(t *testing.T) {
	l := upLab(t, scopes)
	// A multicast route in the sender (a VM has only its default route).
	l.mustIn("web1", "ip", "route", "add", "224.0.0.0/4", "dev", "eth0")
	receivers := []string{"web2", "web3", "db1", "db2", "red1"}
	caps := map[string]func() []string{}
	for _, vm := range receivers {
		stop, pcap := l.captureFile(vm, "eth0", "udp.payload", "ip.ttl", "eth.src")
		caps[vm] = stop
		// Each receiver says something itself and its capture must record
		// it before the test goes on: an empty capture then proves something.
		l.sendUDP(vm, "255.255.255.255", 1, "alive-"+vm)
		waitFor(t, "capture on "+vm+" to record its own packet", 5*time.Second, func() bool {
			st, err := os.Stat(pcap)
			return err == nil && st.Size() > 24 // more than the pcap file header
		})
	}
	l.sendUDP("web1", "10.1.1.255", 1, "subnet-bcast")
	l.sendUDP("web1", "255.255.255.255", 1, "limited-bcast")
	l.sendUDP("web1", "239.1.2.3", 1, "mcast-ttl1")
	l.sendUDP("web1", "239.1.2.3", 4, "mcast-ttl4")
	got := map[string]string{}
	lines := map[string][]string{}
	for _, vm := range receivers {
		lines[vm] = caps[vm]()
		got[vm] = strings.Join(lines[vm], " ")
	}
	hex := func(s string) string {
		const digits = "0123456789abcdef"
		var b strings.Builder
		for i := 0; i < len(s); i++ {
			b.WriteByte(digits[s[i]>>4])
			b.WriteByte(digits[s[i]&15])
		}
		return b.String()
	}
	want := map[string][]string{
		"web2": {"subnet-bcast", "limited-bcast", "mcast-ttl1", "mcast-ttl4"}, // same subnet, other host
		"web3": {"subnet-bcast", "limited-bcast", "mcast-ttl1", "mcast-ttl4"}, // same subnet, same host
		"db1":  {"mcast-ttl4"},                                                // same farm: only TTL > 1 multicast, and web may reach db
		"db2":  {"mcast-ttl4"},                                                // the same, on the sender's host
		"red1": {},                                                            // other farm: nothing
	}
	for _, vm := range receivers {
		if !strings.Contains(got[vm], hex("alive-"+vm)) {
			t.Fatalf("capture on %s missed its own packet: it was not live", vm)
		}
	}
	for vm, msgs := range want {
		for _, all := range []string{"subnet-bcast", "limited-bcast", "mcast-ttl1", "mcast-ttl4"} {
			should := false
			for _, m := range msgs {
				should = should || m == all
			}
			if has := strings.Contains(got[vm], hex(all)); has != should {
				t.Errorf("%s received %q: %v, want %v", vm, all, has, should)
			}
		}
	}
	// Farm-wide multicast reaches another subnet as a router would hand it
	// over: TTL one less, from that subnet's gateway; its own subnet gets it
	// as sent.
	web1MAC := l.mac("web1", "eth0")
	for vm, want := range map[string]string{"web2": "4\t" + web1MAC, "web3": "4\t" + web1MAC,
		"db1": "3\t" + gatewayMAC("10.1.2.1"), "db2": "3\t" + gatewayMAC("10.1.2.1")} {
		seen := false
		for _, line := range lines[vm] {
			if strings.HasPrefix(line, hex("mcast-ttl4")) {
				seen = true
				if !strings.HasSuffix(line, "\t"+want) {
					t.Errorf("%s got the TTL-4 multicast as %q, want TTL and source MAC %q", vm, line, want)
				}
			}
		}
		if !seen {
			t.Errorf("%s: no TTL-4 multicast in its capture to check", vm)
		}
	}
}
