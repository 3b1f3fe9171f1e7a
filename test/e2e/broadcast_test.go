package e2e

import (
	"slices"
	"strconv"
	"testing"
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
  - {name: red2, host: h1, subnet: red/web}
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
	// Each receiver's capture is proven live by a peer in its own subnet.
	peers := map[string]string{"web2": "web3", "web3": "web2", "db1": "db2", "db2": "db1", "red1": "red2", "red2": "red1"}
	receivers := []string{"web2", "web3", "db1", "db2", "red1", "red2"}
	ws := map[string]*watch{}
	var all []*watch
	for _, vm := range receivers {
		ws[vm] = l.watchVM(vm, peers[vm])
		all = append(all, ws[vm])
	}
	proveLive(t, "start", all...)
	l.sendUDP("web1", "10.1.1.255", 1, "subnet-bcast")
	l.sendUDP("web1", "255.255.255.255", 1, "limited-bcast")
	l.sendUDP("web1", "239.1.2.3", 1, "mcast-ttl1")
	l.sendUDP("web1", "239.1.2.3", 4, "mcast-ttl4")
	stopWatches(t, all...)

	want := map[string][]string{
		"web2": {"subnet-bcast", "limited-bcast", "mcast-ttl1", "mcast-ttl4"}, // same subnet, other host
		"web3": {"subnet-bcast", "limited-bcast", "mcast-ttl1", "mcast-ttl4"}, // same subnet, same host
		"db1":  {"mcast-ttl4"},                                                // same farm: only TTL > 1 multicast, and web may reach db
		"db2":  {"mcast-ttl4"},                                                // the same, on the sender's host
		"red1": {},                                                            // other farm: nothing
		"red2": {},                                                            // the same, on the sender's host
	}
	for vm, msgs := range want {
		for _, msg := range []string{"subnet-bcast", "limited-bcast", "mcast-ttl1", "mcast-ttl4"} {
			should := slices.Contains(msgs, msg)
			has := slices.ContainsFunc(ws[vm].frames, func(f frame) bool { return f.payload == msg })
			if has != should {
				t.Errorf("%s received %q: %v, want %v", vm, msg, has, should)
			}
		}
	}
	// Farm-wide multicast reaches another subnet as a router would hand it
	// over: TTL one less, from that subnet's gateway; its own subnet gets it
	// as sent.
	web1MAC := l.mac("web1", "eth0")
	for vm, want := range map[string]struct{ ttl, src string }{"web2": {"4", web1MAC}, "web3": {"4", web1MAC},
		"db1": {"3", gatewayMAC("10.1.2.1")}, "db2": {"3", gatewayMAC("10.1.2.1")}} {
		seen := false
		for _, f := range ws[vm].frames {
			if f.payload == "mcast-ttl4" {
				seen = true
				if f.ttl != want.ttl || f.ethSrc != want.src {
					t.Errorf("%s got the TTL-4 multicast with TTL %s from %s, want TTL %s from %s: %s", vm, f.ttl, f.ethSrc, want.ttl, want.src, f)
				}
			}
		}
		if !seen {
			t.Errorf("%s: no TTL-4 multicast in its capture to check", vm)
		}
	}
}
