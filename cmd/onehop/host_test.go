package main

import (
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/intent"
)

func TestCLIHostAddRemoveDrain(t *testing.T) {
	addr, s := testController(t)
	steps := []cliStep{
		{[]string{"host", "add", "H4"}, `host name "H4" must be 1-12 lowercase`, true}, // checked before the controller is asked
		{[]string{"host", "add", "h4", "--address", "192.168.100.44"}, "host h4 added (fabric address 192.168.100.44)\n", false},
		{[]string{"host", "add", "h4"}, "name: host h4: already exists", true},
		{[]string{"host", "add", "h5", "--address", "x"}, `address: address "x" is not an IPv4 address`, true},
		{[]string{"vm", "create", "blue/web/web4", "--host", "h4"}, "", false},
		{[]string{"host", "remove", "h4"}, "still carries vms blue/web/web4", true},
		{[]string{"host", "remove", "h9"}, "host h9: not found", true},
		{[]string{"host", "remove", "h4", "--drain"}, "host h4 removed\n", false},
	}
	runSteps(t, addr, steps)
	kvs, _, err := s.List(t.Context(), intent.Root)
	if err != nil {
		t.Fatal(err)
	}
	for k := range kvs {
		if strings.Contains(k, "h4") || strings.Contains(k, "web4") {
			t.Errorf("key %s left after the drain", k)
		}
	}
}

func TestCLIHostListGetDeleteCascade(t *testing.T) {
	addr, _ := testController(t)
	steps := []cliStep{
		{[]string{"host", "add", "h4"}, "host h4 added\n", false},
		{[]string{"vm", "create", "blue/web/web4", "--host", "h4"}, "", false},
		{[]string{"host", "list"}, "h4", false},
		{[]string{"host", "get", "h4"}, "host h4: vms blue/web/web4; slivers none\n", false},
		{[]string{"host", "get", "h9"}, "host: host h9: not found", true},
		{[]string{"host", "get", "H4"}, `host name "H4" must be 1-12 lowercase`, true},
		{[]string{"host", "delete", "h4"}, "still carries vms blue/web/web4", true},
		{[]string{"host", "delete", "h4", "--cascade"}, "host h4 removed\n", false},
		{[]string{"host", "get", "h4"}, "host: host h4: not found", true},
		{[]string{"vm", "get", "blue/web/web4"}, "vm: vm blue/web/web4: not found", true},
	}
	runSteps(t, addr, steps)
}
