package main

import (
	"testing"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
)

func TestCLIFloatingCreateAttachListDetachDelete(t *testing.T) {
	addr, s := testController(t)
	n := intent.Node{Name: "h1", Uplinks: []intent.NodeUplink{{Index: 0, IP: "192.168.100.10", Bits: 24}}}
	if err := store.PutJSON(t.Context(), s, intent.NodesPrefix+"h1", n); err != nil {
		t.Fatal(err)
	}
	runSteps(t, addr, []cliStep{
		{[]string{"floating", "create", "nope"}, `ADDRESS "nope": want an IPv4 address on the fabric`, true},
		{[]string{"floating", "create", "10.1.1.9"}, "address: 10.1.1.9 is in the tenant space 10.0.0.0/8", true},
		{[]string{"floating", "create", "192.168.100.50"}, "floating 192.168.100.50: free\n", false},
		{[]string{"floating", "attach", "192.168.100.50", "blue/web"}, `"blue/web": want FARM/SUBNET/VM`, true},
		{[]string{"floating", "attach", "192.168.100.50", "blue/web/web1"}, "floating 192.168.100.50: vm blue/web/web1 on h1\n", false},
		{[]string{"floating", "list"}, "192.168.100.50  blue/web/web1  h1", false},
		{[]string{"floating", "list", "-o", "json"}, `"vm": "blue/web/web1"`, false},
		{[]string{"get", "floating"}, "192.168.100.50  blue/web/web1  h1", false},
		{[]string{"vm", "get", "blue/web/web1"}, "egress -, floating 192.168.100.50\n", false},
		{[]string{"vm", "list"}, "FLOATING\n", false},
		{[]string{"floating", "delete", "192.168.100.50"}, "address: floating address 192.168.100.50 is attached to vm blue/web/web1", true},
		{[]string{"floating", "detach", "192.168.100.50", "-o", "json"}, "{\n  \"address\": \"192.168.100.50\"\n}\n", false},
		{[]string{"floating", "detach", "192.168.100.50"}, "is not attached to any vm", true},
		{[]string{"floating", "delete", "192.168.100.50"}, "floating 192.168.100.50 deleted\n", false},
	})
}
