package main

import "testing"

func TestCLIPublishListAndUnpublish(t *testing.T) {
	addr, _ := testController(t)
	runSteps(t, addr, []cliStep{
		{[]string{"vm", "publish", "blue/web/web1", "--proto", "tcp", "--port", "80", "--public-port", "8080"}, "vm blue/web/web1 on h1: published tcp 80 on 8080\n", false},
		{[]string{"vm", "publish", "blue/web/web1", "--proto", "udp", "--port", "53", "--public-port", "8080"}, "publicPort: publication udp 53 on 8080 of vm blue/web/web1: ports 8080 on uplink 0 overlap h1/publication tcp 80 on 8080 of blue/web/web1's lease 8080", true},
		{[]string{"vm", "publish", "blue/web/web1", "--proto", "icmp", "--port", "1"}, `--proto "icmp": want tcp or udp`, true},
		{[]string{"vm", "publish", "blue/web/web1", "--proto", "tcp"}, "--port 0: want the VM's port, 1..65535", true},
		{[]string{"vm", "get", "blue/web/web1"}, ", egress -, published tcp 80 on 8080\n", false},
		{[]string{"vm", "list"}, "-       tcp 80 on 8080  -\n", false},
		{[]string{"vm", "publications"}, "blue/web/web1  h1    tcp    80    192.168.100.10:8080\n", false},
		{[]string{"vm", "publications", "--farm", "blue", "-o", "json"}, `"publicPort": 8080`, false},
		{[]string{"vm", "unpublish", "blue/web/web1", "--proto", "tcp", "--port", "80"}, "vm blue/web/web1: tcp 80 unpublished\n", false},
		{[]string{"vm", "unpublish", "blue/web/web1", "--proto", "tcp", "--port", "80"}, "port: publication tcp 80 of vm blue/web/web1: not found", true},
		{[]string{"vm", "publications", "-o", "json"}, "[]", false},
	})
}
