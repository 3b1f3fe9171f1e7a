package controller

import (
	"net/http"
	"net/url"
	"slices"
	"testing"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
)

// revokeTopo: blue holds three rules (ids 1-3) and peers with red, which
// peers back; web1's firewall holds two rules (ids 1, 2); a cross-farm TAP
// policy is added by the targets that need one.
const revokeTopo = `name: fuzz
hosts: [{name: h1}, {name: h2}]
farms:
  - name: blue
    subnets: [{name: web}, {name: db}, {name: ops}]
    peers: [red]
    rules:
      - {from: web, to: db, proto: tcp, port: 5432}
      - {from: web, to: ops}
      - {from: ops, to: db, proto: icmp}
  - name: red
    subnets: [{name: web}]
    peers: [blue]
vms:
  - name: web1
    host: h1
    subnet: blue/web
    firewall:
      default_in: deny
      default_out: allow
      rules:
        - {dir: in, proto: tcp, port: "22", action: allow}
        - {dir: in, proto: icmp, action: allow}
  - {name: db1, host: h2, subnet: blue/db}
`

// ruleIDs are the ids of what a farm's record or a firewall stores.
func storedRuleIDs(t *testing.T, s store.Store) (farm, fw []uint32) {
	t.Helper()
	var f intent.Farm
	if err := store.GetJSON(t.Context(), s, intent.FarmsPrefix+"blue", &f); err != nil {
		t.Fatal(err)
	}
	for _, r := range f.NumberRules().Rules {
		farm = append(farm, r.ID)
	}
	var v intent.VM
	if err := store.GetJSON(t.Context(), s, intent.VMKey("blue", "web", "web1"), &v); err != nil {
		t.Fatal(err)
	}
	for _, r := range v.Firewall.NumberRules().Rules {
		fw = append(fw, r.ID)
	}
	return farm, fw
}

// without is ids 1..n but the one id names as the API reads it ("02" is
// 2); all of them when it names none.
func without(n int, id string) []uint32 {
	drop, _ := ParseRuleID("id", id)
	var out []uint32
	for i := uint32(1); i <= uint32(n); i++ {
		if i != drop {
			out = append(out, i)
		}
	}
	return out
}

// FuzzAPIRuleIDPath: any farm and id in the path of GET and DELETE of a
// rule is answered below 500, errors naming a field; a delete that
// succeeds removed exactly that rule, and the others kept their ids.
func FuzzAPIRuleIDPath(f *testing.F) {
	for _, p := range [][2]string{{"blue", "2"}, {"blue", "3"}, {"blue", "4"}, {"blue", "0"}, {"blue", "-1"}, {"blue", "02"},
		{"blue", "4294967297"}, {"red", "1"}, {"nope", "1"}, {"", "1"}, {"blue", ""}, {"a/b", ".."}} {
		f.Add(p[0], p[1])
	}
	send := fuzzAPIOn(f, revokeTopo)
	f.Fuzz(func(t *testing.T, farm, id string) {
		path := "/v1/farms/" + url.PathEscape(farm) + "/rules/" + url.PathEscape(id)
		send(t, "GET", path, "")
		s, code := send(t, "DELETE", path, "")
		got, _ := storedRuleIDs(t, s)
		switch {
		case code == http.StatusNoContent && (farm != "blue" || len(got) != 2 || !slices.Equal(got, without(3, id))):
			t.Fatalf("DELETE %s: 204, rules left %v", path, got)
		case code != http.StatusNoContent && farm == "blue" && len(got) != 3:
			t.Fatalf("DELETE %s: %d, but rules left %v", path, code, got)
		}
	})
}

// FuzzAPIFirewallRuleIDPath: the same for a VM's firewall rules.
func FuzzAPIFirewallRuleIDPath(f *testing.F) {
	for _, p := range [][2]string{{"web1", "1"}, {"web1", "2"}, {"web1", "3"}, {"db1", "1"}, {"nope", "1"}, {"web1", "x"}, {"web1", "1e3"}, {"", ""}} {
		f.Add(p[0], p[1])
	}
	send := fuzzAPIOn(f, revokeTopo)
	f.Fuzz(func(t *testing.T, vm, id string) {
		path := "/v1/farms/blue/subnets/web/vms/" + url.PathEscape(vm) + "/firewall"
		send(t, "GET", path, "")
		s, code := send(t, "DELETE", path+"/rules/"+url.PathEscape(id), "")
		_, got := storedRuleIDs(t, s)
		switch {
		case code == http.StatusOK && (vm != "web1" || !slices.Equal(got, without(2, id))):
			t.Fatalf("DELETE %s rule %q: 200, rules left %v", vm, id, got)
		case code != http.StatusOK && len(got) != 2:
			t.Fatalf("DELETE %s rule %q: %d, but rules left %v", vm, id, code, got)
		}
	})
}

// FuzzAPIUnpeerPath: any farm, other farm and cascade value is answered
// below 500, errors naming a field; an unpeer that succeeds withdrew that
// half only, and deleted the TAP policy relying on it only with cascade.
func FuzzAPIUnpeerPath(f *testing.F) {
	for _, p := range [][3]string{{"blue", "red", ""}, {"blue", "red", "true"}, {"red", "blue", "false"}, {"blue", "blue", ""},
		{"blue", "green", "1"}, {"nope", "red", "true"}, {"a/b", "..", "x"}, {"", "", ""}} {
		f.Add(p[0], p[1], p[2])
	}
	send := fuzzAPIOn(f, revokeTopo)
	f.Fuzz(func(t *testing.T, farm, with, cascade string) {
		path := "/v1/farms/" + url.PathEscape(farm) + "/peers"
		send(t, "GET", path, "")
		s, code := send(t, "DELETE", path+"/"+url.PathEscape(with)+"?cascade="+url.QueryEscape(cascade), "")
		var b, r intent.Farm
		if err := store.GetJSON(t.Context(), s, intent.FarmsPrefix+"blue", &b); err != nil {
			t.Fatal(err)
		}
		if err := store.GetJSON(t.Context(), s, intent.FarmsPrefix+"red", &r); err != nil {
			t.Fatal(err)
		}
		halves := len(b.Peers) + len(r.Peers)
		if (code == http.StatusNoContent) != (halves == 1) {
			t.Fatalf("DELETE %s/%s?cascade=%q: %d, halves left: blue %v red %v", farm, with, cascade, code, b.Peers, r.Peers)
		}
	})
}
