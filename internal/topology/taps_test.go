package topology

import (
	"strings"
	"testing"
)

const tapsHead = `name: t
hosts: [{name: h1}, {name: h2}]
farms:
  - {name: blue, subnets: [{name: web}, {name: ops}], peers: [red, green]}
  - {name: red, subnets: [{name: app}], peers: [blue]}
  - {name: green, subnets: [{name: lan}]}
vms:
  - {name: web1, host: h1, subnet: blue/web}
  - {name: web2, host: h2, subnet: blue/web}
  - {name: mon, host: h2, subnet: blue/ops}
  - {name: app1, host: h1, subnet: red/app}
  - {name: gr1, host: h1, subnet: green/lan}
taps:
`

func TestTopologyTapsAreReadWithTheCLIsFields(t *testing.T) {
	f, err := Parse("t.yaml", []byte(tapsHead+`  - name: web-http
    sender: blue/web/web1
    receiver: blue/web/web2
    monitor: blue/ops/mon
    proto: tcp
    sport: 1024-65535
    dport: 80
    vlan: 257
    both_directions: true
  - {name: red-dns, sender: red/app/app1, receiver: any, monitor: blue/ops/mon, proto: udp, dport: 53, cross_farm: true}
  - {name: by-addr, sender: 10.1.1.2, receiver: blue/web, monitor: "02:00:0a:01:02:02"}
  - name: to-col
    sender: red/app/app1
    receiver: blue/web
    collector: 192.168.100.200
    encap: erspan3
    cross_farm: true
  - {name: by-addr-col, sender: 10.1.1.2, receiver: any, collector: 192.168.100.201}
`))
	if err != nil {
		t.Fatal(err)
	}
	ts := f.Taps()
	if len(ts) != 5 {
		t.Fatalf("taps %+v", ts)
	}
	w := ts[0]
	if w.Name != "web-http" || w.Sender != "blue/web/web1" || w.Proto != "tcp" || w.Sport != "1024-65535" || w.Dport != "80" || w.VLAN != "257" ||
		!w.BothDirections || w.CrossFarm || w.Line != 14 || w.lineOf("dport") != 20 {
		t.Fatalf("web-http %+v", w)
	}
	if r := ts[1]; !r.CrossFarm || r.Receiver != "any" || r.Line != 23 {
		t.Fatalf("red-dns %+v", r)
	}
	if c := ts[3]; c.Collector != "192.168.100.200" || c.Encap != "erspan3" || c.Monitor != "" || c.lineOf("collector") != 28 || c.lineOf("encap") != 29 {
		t.Fatalf("to-col %+v", c)
	}
	if c := ts[4]; c.Collector != "192.168.100.201" || c.Encap != "" {
		t.Fatalf("by-addr-col %+v", c)
	}
}

func TestTopologyTapErrorsNameTheLine(t *testing.T) {
	cases := []struct {
		taps string
		want string
	}{
		{"  - {name: a, sender: any, receiver: any}\n", `t.yaml:14: tap "a": monitor: no monitor and no collector`},
		// A collector instead of a monitor: the API's checks, by key.
		{"  - name: a\n    sender: blue/web\n    receiver: any\n    collector: x\n", `t.yaml:17: tap "a": collector: "x" is not an IPv4 address`},
		{"  - name: a\n    sender: blue/web\n    receiver: any\n    collector: 224.0.0.5\n", `t.yaml:17: tap "a": collector: 224.0.0.5 is not a unicast address`},
		{"  - name: a\n    sender: blue/web\n    receiver: any\n    collector: 192.168.100.200\n    encap: vxlan\n", `t.yaml:18: tap "a": encap: unknown encapsulation "vxlan": want erspan2, erspan3, gre`},
		{"  - name: a\n    sender: blue/web\n    receiver: any\n    monitor: blue/ops/mon\n    encap: gre\n", `t.yaml:18: tap "a": encap: encap "gre" without a collector`},
		{"  - name: a\n    sender: blue/web\n    receiver: any\n    monitor: blue/ops/mon\n    collector: 192.168.100.200\n", `t.yaml:18: tap "a": collector: a policy has a monitor VM (blue/ops/mon) or a collector (192.168.100.200), not both`},
		{"  - name: a\n    sender: blue/web\n    receiver: any\n    collector: 10.9.9.9\n", `t.yaml:17: tap "a": collector: 10.9.9.9 is not on the fabric (192.168.100.0/24)`},
		{"  - name: a\n    sender: blue/web\n    receiver: any\n    collector: 192.168.100.10\n", `t.yaml:17: tap "a": collector: 192.168.100.10 is host h1's own address`},
		{"  - name: a\n    sender: any\n    receiver: any\n    collector: 192.168.100.200\n", `t.yaml:16: tap "a": receiver: sender and receiver are both any`},
		{"  - name: a\n    sender: red/app/app1\n    receiver: blue/web\n    collector: 192.168.100.200\n", `t.yaml:16: tap "a": receiver: the sender is in farm red and the receiver in farm blue: a policy spans two farms only if it is cross-farm`},
		{"  - name: a\n    sender: green/lan/gr1\n    receiver: blue/web\n    collector: 192.168.100.200\n    cross_farm: true\n", `t.yaml:16: tap "a": receiver: cross-farm: farms green and blue do not peer`},
		{"  - {name: a, sender: any, receiver: any, collector: [x]}\n", `t.yaml:14: tap collector must be`},
		{"  - {name: A, sender: any, receiver: any, monitor: blue/ops/mon}\n", `t.yaml:14: tap "A": name: tap name "A" must be`},
		{"  - name: a\n    sender: any\n    receiver: any\n    monitor: blue/ops/mon\n    dport: 0\n", `t.yaml:18: tap "a": dport: ports "0": port 0 is not a port`},
		{"  - name: a\n    sender: any\n    receiver: any\n    monitor: blue/ops/mon\n    proto: icmp\n    sport: 7\n", `t.yaml:19: tap "a": sport: a sport filter needs proto tcp, udp or any`},
		{"  - name: a\n    sender: any\n    receiver: any\n    monitor: blue/ops/mon\n    vlan: 3\n", `t.yaml:18: tap "a": vlan: vlan 3 is not a segment`},
		{"  - {name: a, sender: any, receiver: any, monitor: blue/ops/mon, cross_farm: yes}\n", `t.yaml:14: tap cross_farm must be true or false`},
		{"  - {name: a, sender: any, receiver: any, monitor: blue/ops/mon, filter: x}\n", `t.yaml:14: unknown key "filter" in tap (known: both_directions, collector, cross_farm, dport, encap`},
		{"  - name: a\n    sender: blue/web/web9\n    receiver: any\n    monitor: blue/ops/mon\n", `t.yaml:15: tap "a": sender blue/web/web9 is not a VM of this file`},
		{"  - name: a\n    sender: blue/ops/web1\n    receiver: any\n    monitor: blue/ops/mon\n", `t.yaml:15: tap "a": sender blue/ops/web1 is not a VM of this file`},
		{"  - name: a\n    sender: any\n    receiver: blue/db\n    monitor: blue/ops/mon\n", `t.yaml:16: tap "a": receiver blue/db is not a subnet of this file`},
		{"  - name: a\n    sender: any\n    receiver: any\n    monitor: blue/ops\n", `t.yaml:17: tap "a": monitor: "blue/ops" is not one VM`},
		{"  - name: a\n    sender: blue/web/web1\n    receiver: blue/web/web1\n    monitor: blue/ops/mon\n", `t.yaml:16: tap "a": receiver blue/web/web1 is also the sender`},
		{"  - name: a\n    sender: blue/ops/mon\n    receiver: any\n    monitor: blue/ops/mon\n", `t.yaml:17: tap "a": monitor blue/ops/mon is the policy's sender`},
		{"  - name: a\n    sender: red/app/app1\n    receiver: any\n    monitor: blue/ops/mon\n", `t.yaml:17: tap "a": the monitor is in farm blue and the sender in farm red`},
		{"  - name: a\n    sender: green/lan/gr1\n    receiver: any\n    monitor: blue/ops/mon\n    cross_farm: true\n", `t.yaml:17: tap "a": cross-farm: the monitor's farm blue and the sender's farm green do not peer`},
		{"  - {name: a, sender: any, receiver: any, monitor: blue/ops/mon}\n  - {name: a, sender: blue/web, receiver: any, monitor: blue/ops/mon}\n", `t.yaml:15: duplicate tap "a" (first defined on line 14)`},
		{"  name: a\n", `t.yaml:14: taps must be a list`},
	}
	for _, tc := range cases {
		_, err := Parse("t.yaml", []byte(tapsHead+tc.taps))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v\nwant %q", tc.taps, err, tc.want)
		}
	}
}
