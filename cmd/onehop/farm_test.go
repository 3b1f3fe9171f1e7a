package main

import (
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/intent"
)

func TestCLIFarmCreateListGetDeleteAndCascade(t *testing.T) {
	addr, s := testController(t)
	steps := []cliStep{
		{[]string{"farm", "create", "red", "--proxy-arp"}, "farm red created: 10.2.0.0/16, proxy ARP on\n", false},
		{[]string{"farm", "list"}, "red   2   10.2.0.0/16", false},
		{[]string{"farm", "get", "blue"}, "farm blue: id 1, 10.1.0.0/16, proxy ARP off, egress off\n", false},
		{[]string{"farm", "get", "red", "-o", "json"}, `"proxyARP": true`, false},
		{[]string{"farm", "get", "nope"}, `farm: farm "nope": not found`, true},
		{[]string{"farm", "get", "Blue!"}, `farm name "Blue!" must be lowercase`, true}, // checked before the controller is asked
		{[]string{"farm", "delete", "blue"}, "farm: farm blue is in use by subnet blue/db, subnet blue/web, vm blue/web/web1: delete them first, or delete it with cascade=true (CLI --cascade)", true},
		{[]string{"farm", "delete", "blue", "--cascade"}, "farm blue deleted\n", false},
		{[]string{"farm", "get", "blue"}, `farm: farm "blue": not found`, true},
		{[]string{"farm", "delete", "blue"}, `farm: farm "blue": not found`, true},
		// blue's id is free again.
		{[]string{"farm", "create", "green"}, "farm green created: 10.1.0.0/16\n", false},
		{[]string{"farm", "delete", "red"}, "farm red deleted\n", false},
		{[]string{"farm", "list", "-o", "json"}, `"name": "green"`, false},
	}
	runSteps(t, addr, steps)
	kvs, _, err := s.List(t.Context(), intent.Root)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range kvs {
		if strings.HasPrefix(k, intent.TenantCertRevocationsPrefix+"farm/") {
			continue // a deleted farm's tenant certificates stay revoked
		}
		if strings.Contains(k, "blue") || strings.Contains(k, "red") || strings.Contains(string(v), "web1") {
			t.Errorf("key %s left after the deletes: %s", k, v)
		}
	}
}

func TestCLISubnetCreateListGetDeleteAndCascade(t *testing.T) {
	addr, _ := testController(t)
	steps := []cliStep{
		{[]string{"subnet", "create", "blue/app"}, "subnet blue/app created: 10.1.3.0/24, gateway 10.1.3.1\n", false},
		{[]string{"subnet", "create", "blue/App"}, `subnet name "App" must be lowercase`, true},
		{[]string{"subnet", "list", "--farm", "blue"}, "blue/app  10.1.3.0/24", false},
		{[]string{"subnet", "list", "--farm", "Blue"}, `--farm: farm name "Blue" must be lowercase`, true},
		{[]string{"subnet", "list", "--farm", "nope"}, `farm: farm "nope": not found`, true},
		{[]string{"subnet", "get", "blue/web"}, "subnet blue/web: id 1, 10.1.1.0/24, gateway 10.1.1.1, egress as its farm's\n", false},
		{[]string{"subnet", "set", "blue/web", "--egress=false"}, "subnet blue/web: egress off (its own)\n", false},
		{[]string{"subnet", "set", "blue/web", "--egress", "--egress-slice", "64"}, "subnet blue/web: egress on to 0.0.0.0/0, slices of 64 ports (its own)\n", false},
		{[]string{"subnet", "list", "--farm", "blue"}, "blue/web  10.1.1.0/24  10.1.1.1  on to 0.0.0.0/0, slices of 64 ports (its own)", false},
		{[]string{"subnet", "set", "blue/web", "--egress-as-farm"}, "subnet blue/web: egress as its farm's\n", false},
		{[]string{"subnet", "set", "blue/web"}, "nothing to set: give --egress, --egress=false or --egress-as-farm", true},
		{[]string{"subnet", "set", "blue/web", "--egress", "--egress-slice", "8"}, "--egress: slice of 8 ports: want 16..4096", true},
		{[]string{"subnet", "get", "blue"}, `"blue": want FARM/SUBNET`, true},
		{[]string{"subnet", "get", "blue/nope"}, "subnet: subnet blue/nope: not found", true},
		{[]string{"subnet", "delete", "blue/web"}, "subnet: subnet blue/web is in use by vm blue/web/web1: delete them first", true},
		{[]string{"subnet", "delete", "blue/web", "--cascade"}, "subnet blue/web deleted\n", false},
		{[]string{"vm", "get", "blue/web/web1"}, `subnet: subnet blue/web: not found`, true},
		// Its id and web1's address are free again.
		{[]string{"subnet", "create", "blue/front"}, "subnet blue/front created: 10.1.1.0/24, gateway 10.1.1.1\n", false},
		{[]string{"vm", "create", "blue/front/front1", "--host", "h1"}, "vm blue/front/front1 on h1: 10.1.1.2,", false},
		{[]string{"subnet", "delete", "blue/app"}, "subnet blue/app deleted\n", false},
		{[]string{"subnet", "list", "-o", "json"}, `"name": "front"`, false},
	}
	runSteps(t, addr, steps)
}

func TestCLIFarmSetEgressChecksItsFlagsAndGivesSlices(t *testing.T) {
	addr, _ := testController(t)
	runSteps(t, addr, []cliStep{
		{[]string{"farm", "set", "blue"}, "nothing to set: give --egress (or --egress=false)", true},
		{[]string{"farm", "set", "blue", "--egress", "--egress-slice", "8"}, "--egress: slice of 8 ports: want 16..4096 (the default is 256)", true},
		{[]string{"farm", "set", "blue", "--egress", "--egress-to", "10.1.2.3/8"}, `--egress-to: destination 1 "10.1.2.3/8" has host bits set: did you mean 10.0.0.0/8?`, true},
		{[]string{"farm", "set", "blue", "--egress", "--egress-to", "192.0.2.0/24", "--egress-slice", "64"}, "farm blue: egress on to 192.0.2.0/24, slices of 64 ports\n", false},
		{[]string{"vm", "get", "blue/web/web1"}, "egress slice 1024-1087\n", false},
		{[]string{"farm", "set", "blue", "--egress", "--egress-slice", "64", "-o", "json"}, `"slice": 64`, false},
		{[]string{"farm", "set", "blue", "--egress=false"}, "farm blue: egress off\n", false},
		{[]string{"vm", "get", "blue/web/web1"}, "egress -\n", false},
	})
}
