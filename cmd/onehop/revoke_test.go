package main

import (
	"encoding/json"
	"testing"

	"github.com/onehop/onehop/internal/controller"
)

func TestCLIRuleListGetDeleteByID(t *testing.T) {
	addr, _ := tapController(t)
	runSteps(t, addr, []cliStep{
		{[]string{"allow", "blue/web", "blue/db", "--proto", "tcp", "--port", "5432"}, "farm blue allows blue/web -> blue/db tcp/5432 (rule 1)\n", false},
		{[]string{"allow", "blue/web", "blue/ops"}, "farm blue allows blue/web -> blue/ops any (rule 2)\n", false},
		{[]string{"allow", "blue/db", "blue/ops", "--proto", "icmp"}, "(rule 3)\n", false},
		{[]string{"allow", "blue/web", "red/app", "--proto", "tcp", "--port", "443", "--farm", "red"}, "farm red allows blue/web -> red/app tcp/443 (rule 1)\n", false},
		{[]string{"rule", "list", "--farm", "blue"}, "FARM  ID  FROM      TO        WHAT      IN FORCE\n" +
			"blue  1   blue/web  blue/db   tcp/5432  true\n" +
			"blue  2   blue/web  blue/ops  any       true\n" +
			"blue  3   blue/db   blue/ops  icmp      true\n", false},
		{[]string{"rule", "delete", "blue", "2"}, "rule 2 of blue deleted\n", false},
		{[]string{"rule", "get", "blue", "3"}, "rule 3 of blue: blue/db -> blue/ops icmp, in force\n", false},
		{[]string{"rule", "get", "red", "1"}, "rule 1 of red: blue/web -> red/app tcp/443, not in force (across farms, both must peer and allow it)\n", false},
		{[]string{"rule", "get", "blue", "2"}, "id: rule 2 of farm blue: not found", true},
		{[]string{"rule", "delete", "blue", "2"}, "id: rule 2 of farm blue: not found", true},
		{[]string{"rule", "delete", "blue", "two"}, `ID: rule id "two": want a positive number`, true},
		{[]string{"rule", "delete", "Blue!", "1"}, "FARM: ", true},
		{[]string{"rule", "list", "--farm", "nope"}, `farm: farm "nope": not found`, true},
		{[]string{"rule", "list"}, "red   1   blue/web  red/app   tcp/443   false\n", false},
		{[]string{"get", "rules"}, "", false},
	})
	out, err := runOut("rule", "list", "--farm", "blue", "-o", "json", "--api", addr)
	if err != nil {
		t.Fatal(err)
	}
	var views []controller.RuleView
	if err := json.Unmarshal([]byte(out), &views); err != nil || len(views) != 2 || views[0].ID != 1 || views[1].ID != 3 {
		t.Fatalf("rule list -o json: %v %+v\n%s", err, views, out)
	}
}

func TestCLIUnpeerRefusesWhileACrossFarmTapReliesOnItUnlessCascade(t *testing.T) {
	addr, _ := tapController(t)
	runSteps(t, addr, []cliStep{
		{[]string{"tap", "create", "watch", "--sender", "red/app/app1", "--receiver", "any", "--monitor", "blue/ops/mon", "--cross-farm"}, "tap watch: id 1", false},
		{[]string{"unpeer", "red", "blue"}, "with: farm red's peering with blue is in use by tap watch: delete them first, or delete it with cascade=true (CLI --cascade), which deletes them", true},
		{[]string{"unpeer", "blue", "red", "--cascade"}, "blue no longer peers with red: nothing flows between them\n", false},
		{[]string{"tap", "get", "watch"}, "name: tap watch: not found", true},
		{[]string{"unpeer", "blue", "red"}, "with: farm blue's peering with red: not found", true},
		{[]string{"unpeer", "red", "blue"}, "red no longer peers with blue", false},
		{[]string{"peer", "blue", "red"}, "blue peers with red; nothing flows until red peers back\n", false},
		{[]string{"unpeer", "blue"}, "accepts 2 arg(s)", true},
	})
}

func TestCLIFirewallListAndDeleteByID(t *testing.T) {
	addr, _ := tapController(t)
	runSteps(t, addr, []cliStep{
		{[]string{"firewall", "list", "blue/web/web1"}, "blue/web/web1 firewall: default in allow, out allow (first match wins)\nID  DIR  PROTO  PORTS  REMOTE  ACTION\n", false},
		{[]string{"firewall", "add", "blue/web/web1", "--in", "--proto", "tcp", "--port", "22", "--allow", "--default-in", "deny"}, "blue/web/web1 firewall: default in deny, out allow, 1 rules (rule 1 added)\n", false},
		{[]string{"firewall", "add", "blue/web/web1", "--in", "--proto", "tcp", "--port", "8000-8080", "--from", "10.1.2.0/24", "--allow"}, "(rule 2 added)\n", false},
		{[]string{"firewall", "delete", "blue/web/web1", "1"}, "rule 1 of blue/web/web1's firewall deleted; 1 rules left\n", false},
		{[]string{"firewall", "list", "blue/web/web1"}, "blue/web/web1 firewall: default in deny, out allow (first match wins)\n" +
			"ID  DIR  PROTO  PORTS      REMOTE       ACTION\n" +
			"2   in   tcp    8000-8080  10.1.2.0/24  allow\n", false},
		{[]string{"firewall", "delete", "blue/web/web1", "1"}, "id: rule 1 of blue/web/web1's firewall: not found", true},
		{[]string{"firewall", "delete", "blue/web/web1", "0"}, "ID: rule id \"0\": want a positive number", true},
		{[]string{"firewall", "list", "blue/web"}, `"blue/web": want FARM/SUBNET/VM`, true},
		{[]string{"firewall", "list", "blue/web/nope"}, "vm: vm blue/web/nope: not found", true},
	})
}
