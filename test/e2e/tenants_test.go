package e2e

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/lab"
	"github.com/onehop/onehop/internal/testenv"
)

// TestPrivilegedTwoTenantTokensConsentAndAreRevoked plays the operator and
// two tenants, blue and red, each with its own token, over the lab's https
// API from a node on the fabric (h1's namespace). Every write blue's token
// tries on red's farm is refused 403; blue's half of a peering and both
// farms' rules open nothing (web1's pings to red1 are dropped on h1 as
// not_visible); red's own half, with red's token, opens what the rules say
// (the same pings are answered, the reverse direction stays shut); blue's
// revoked token gets 401.
func TestPrivilegedTwoTenantTokensConsentAndAreRevoked(t *testing.T) {
	l := upLab(t, twoFarms)
	st, err := lab.Load(testRoot, l.name)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(st.APIURL, "https://") {
		t.Fatalf("lab API at %q; want https", st.APIURL)
	}
	ca := lab.CAFile(st)
	dir := t.TempDir()
	tokens := map[string]string{"admin": lab.TokenFile(st)}
	// as runs the CLI from the fabric with who's token.
	as := func(who string, args ...string) (string, error) {
		return l.in("h1", append(append([]string{binary}, args...), "--api", st.APIURL, "--ca", ca, "--token-file", tokens[who])...)
	}
	must := func(who string, args ...string) string {
		t.Helper()
		out, err := as(who, args...)
		if err != nil {
			t.Fatalf("%s: onehop %s: %v\n%s", who, strings.Join(args, " "), err, out)
		}
		return out
	}
	for _, f := range []string{"blue", "red"} {
		tokens[f] = filepath.Join(dir, f+".token")
		must("admin", "tenant", "token", "create", "--farm", f, "--out", tokens[f])
	}

	// Every write of blue's token on red's farm: 403, a permission problem.
	for _, args := range [][]string{
		{"subnet", "create", "red/app"},
		{"vm", "create", "red/web/evil1", "--host", "h1"},
		{"peer", "red", "blue"},
		{"allow", "red/web", "blue/web"},
		{"firewall", "add", "red/web/red1", "--in", "--deny", "--proto", "icmp"},
		{"farm", "create", "green"},
		{"host", "add", "h9"},
		{"tenant", "token", "create", "--farm", "blue"},
	} {
		out, err := as("blue", args...)
		if err == nil || !strings.Contains(out, "permission denied: tenant blue") {
			t.Errorf("blue's token: onehop %s: %v\n%s\nwant a 403 saying permission denied", strings.Join(args, " "), err, out)
		}
	}

	// Both rules, blue's half of the peering: nothing flows.
	must("blue", "allow", "blue/web", "red/web")
	must("red", "allow", "blue/web", "red/web", "--farm", "red")
	if out := must("blue", "peer", "blue", "red"); !strings.Contains(out, "nothing flows until red peers back") {
		t.Errorf("blue's half: %s", out)
	}
	web1, red1 := l.ip("web1"), l.ip("red1")
	before := l.metrics("h1")
	if err := l.ping("web1", red1, 3); err == nil {
		t.Error("web1 reached red1 with only blue's half of the peering")
	}
	if d := rise(before, l.metrics("h1"), drops("not_visible")); d < 3 {
		t.Errorf("h1 not_visible drops rose by %v; want web1's 3 pings dropped there", d)
	}
	var rules []struct {
		Farm      string `json:"farm"`
		Effective bool   `json:"effective"`
	}
	if err := json.Unmarshal([]byte(must("admin", "get", "rules", "-o", "json")), &rules); err != nil || len(rules) != 2 {
		t.Fatalf("rules: %v %+v", err, rules)
	}
	for _, r := range rules {
		if r.Effective {
			t.Errorf("farm %s's rule is effective with one half of the peering", r.Farm)
		}
	}

	// red's own half, by red's identity: the rules apply.
	if out := must("red", "peer", "red", "blue"); !strings.Contains(out, "peer with each other") {
		t.Errorf("red's half: %s", out)
	}
	testenv.Eventually(t, "web1 to reach red1 once both farms peered", 15*time.Second, func() error {
		return l.ping("web1", red1, 2)
	})
	// Only what the rules say: blue/web -> red/web, one way.
	if err := l.ping("red1", web1, 2); err == nil {
		t.Error("red1 reached web1: no rule lets red/web open to blue/web")
	}

	// The trail names each tenant's writes; each sees its own farm's.
	audit := must("blue", "audit", "-o", "json")
	if !strings.Contains(audit, `"who": "tenant blue (token`) || strings.Contains(audit, `"farm": "red"`) {
		t.Errorf("blue's audit trail:\n%s", audit)
	}
	if all := must("admin", "audit"); !strings.Contains(all, "tenant red (token") || !strings.Contains(all, "PUT /v1/farms/red/peers/blue") {
		t.Errorf("the admin's audit trail lacks red's peering:\n%s", all)
	}

	// Revoked: 401 on blue's next request; red's token still works.
	var toks []struct{ ID, Farm string }
	if err := json.Unmarshal([]byte(must("admin", "tenant", "token", "list", "--farm", "blue", "-o", "json")), &toks); err != nil || len(toks) != 1 {
		t.Fatalf("blue's tokens: %v %+v", err, toks)
	}
	must("admin", "tenant", "token", "revoke", toks[0].ID)
	if out, err := as("blue", "get", "vms"); err == nil || !strings.Contains(out, "HTTP 401") {
		t.Errorf("blue's revoked token: %v\n%s\nwant 401", err, out)
	}
	must("red", "get", "vms")
}
