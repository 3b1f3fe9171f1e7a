package main

import (
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/controller"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/topology"
)

// testController serves a controller holding farm blue (web, db) and web1
// on h1, and returns its API address and store.
func testController(t *testing.T) (string, *store.Memory) {
	t.Helper()
	topo, err := topology.Parse("t.yaml", []byte(`name: t
hosts: [{name: h1}]
farms: [{name: blue, subnets: [{name: web}, {name: db}]}]
vms: [{name: web1, host: h1, subnet: blue/web}]
`))
	if err != nil {
		t.Fatal(err)
	}
	s := store.NewMemory()
	c := controller.New(s, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := c.ApplyTopology(t.Context(), topo); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(c.API())
	t.Cleanup(srv.Close)
	return srv.URL, s
}

// The CLI checks a firewall rule and a visibility rule with the controller's
// own check (package policy) and names the flag to change, before it
// contacts the controller (none listens here).
func TestCLIChecksRulesWithTheControllersCheckAndNamesTheFlag(t *testing.T) {
	noAPI := []string{"--api", "http://127.0.0.1:1"}
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"firewall", "add", "blue/web/web1", "--in", "--deny", "--proto", "icmp", "--port", "22"}, `--port: ports need proto tcp or udp, not "icmp"`},
		{[]string{"firewall", "add", "blue/web/web1", "--in", "--deny", "--proto", "sctp"}, `--proto: protocol "sctp" is not tcp, udp, icmp or any`},
		{[]string{"firewall", "add", "blue/web/web1", "--in", "--deny", "--from", "10.1.2.0/40"}, `--from/--to: cidr "10.1.2.0/40" is not an IPv4 prefix like 10.1.2.0/24`},
		{[]string{"firewall", "add", "blue/web/web1", "--in", "--deny", "--port", "90-80"}, `--port: ports "90-80": the range ends below its start; want N-M with N <= M`},
		{[]string{"firewall", "add", "blue/web/web1", "--default-in", "maybe"}, `--default-in: defaultIn "maybe": want allow or deny`},
		{[]string{"allow", "blue/web", "blue/db", "--proto", "icmp", "--port", "7"}, "--port: port 7: a port needs proto tcp or udp"},
		{[]string{"allow", "blue/web", "blue/db", "--proto", "sctp"}, `--proto: protocol "sctp" is not tcp, udp, icmp or any`},
	}
	for _, c := range cases {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			err := run(append(c.args, noAPI...)...)
			if err == nil || err.Error() != c.want {
				t.Fatalf("err = %v, want %q", err, c.want)
			}
		})
	}
}

// "TCP" and "tcp" are one rule, through the CLI as through the API: the
// second is refused as a duplicate, and what is stored is lowercase.
func TestCLIRuleThatDiffersOnlyInCaseIsADuplicate(t *testing.T) {
	addr, s := testController(t)
	steps := []struct {
		args []string
		want string // "" for success
	}{
		{[]string{"firewall", "add", "blue/web/web1", "--in", "--deny", "--proto", "TCP", "--port", "22"}, ""},
		{[]string{"firewall", "add", "blue/web/web1", "--in", "--deny", "--proto", "tcp", "--port", "22-22"}, "rule: the same rule as rule 1 of web1's firewall: already exists"},
		{[]string{"firewall", "add", "blue/web/web1", "--default-in", "DENY"}, ""},
		{[]string{"allow", "blue/web", "blue/db", "--proto", "TCP", "--port", "5432"}, ""},
		{[]string{"allow", "blue/web", "blue/db", "--proto", "tcp", "--port", "5432"}, "body: rule blue/web -> blue/db tcp/5432 (farm blue's rule 1): already exists"},
		{[]string{"allow", "blue/web", "blue/db", "--proto", "any"}, ""},
		{[]string{"allow", "blue/web", "blue/db"}, "already exists"},
	}
	for _, st := range steps {
		err := run(append(st.args, "--api", addr)...)
		switch {
		case st.want == "" && err != nil:
			t.Fatalf("%v: %v", st.args, err)
		case st.want != "" && (err == nil || !strings.Contains(err.Error(), st.want)):
			t.Fatalf("%v: err = %v, want %q", st.args, err, st.want)
		}
	}
	var v intent.VM
	if err := store.GetJSON(t.Context(), s, intent.VMsPrefix+"blue/web/web1", &v); err != nil {
		t.Fatal(err)
	}
	want := intent.FirewallRule{ID: 1, Dir: "in", Proto: "tcp", PortLo: 22, PortHi: 22, Action: "deny"}
	if v.Firewall == nil || v.Firewall.DefaultIn != "deny" || len(v.Firewall.Rules) != 1 || v.Firewall.Rules[0] != want {
		t.Fatalf("stored firewall %+v, want default in deny and %+v", v.Firewall, want)
	}
}
