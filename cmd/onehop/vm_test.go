package main

import (
	"testing"

	"github.com/onehop/onehop/internal/intent"
)

func TestCLIVMGetListDeleteAndTheFreedAddressIsReused(t *testing.T) {
	addr, _ := testController(t)
	steps := []cliStep{
		{[]string{"vm", "get", "blue/web/web1"}, "vm blue/web/web1 on h1: 10.1.1.2, MAC 02:00:0a:01:01:02, gateway 10.1.1.1, vif " + intent.VifName("blue", "web1") + ", firewall -, egress -\n", false},
		{[]string{"vm", "get", "blue/web/web1", "-o", "json"}, `"ip": "10.1.1.2"`, false},
		{[]string{"vm", "get", "blue/web/nope"}, "vm: vm blue/web/nope: not found", true},
		{[]string{"vm", "get", "blue/web/Web1"}, `vm name "Web1" must be lowercase`, true},
		{[]string{"vm", "get", "blue/web"}, `"blue/web": want FARM/SUBNET/VM`, true},
		{[]string{"vm", "create", "blue/db/db1", "--host", "h1"}, "vm blue/db/db1 on h1: 10.1.2.2,", false},
		{[]string{"vm", "list", "--farm", "blue"}, "blue/db/db1    h1    10.1.2.2", false},
		{[]string{"vm", "list", "--farm", "nope"}, `farm: farm "nope": not found`, true},
		{[]string{"vm", "delete", "blue/web/web1"}, "vm blue/web/web1 deleted\n", false},
		{[]string{"vm", "delete", "blue/web/web1"}, "vm: vm blue/web/web1: not found", true},
		{[]string{"vm", "create", "blue/web/web5", "--host", "h1"}, "vm blue/web/web5 on h1: 10.1.1.2,", false},
		{[]string{"vm", "list", "-o", "json"}, `"name": "web5"`, false},
	}
	runSteps(t, addr, steps)
}
