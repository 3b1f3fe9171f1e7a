package controller

import (
	"errors"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/desired"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
)

func TestSubnetMoveIsRefusedAcrossFarmsIntoItsOwnSubnetAnUnknownOneOrUnderATap(t *testing.T) {
	web1 := intent.VM{Farm: "blue", Subnet: "web", Name: "web1"}
	tap := func(sender, receiver, monitor string) []intent.TapPolicy {
		return []intent.TapPolicy{{Name: "t1", Sender: sender, Receiver: receiver, Monitor: monitor}}
	}
	for _, tc := range []struct {
		name, farm, subnet string
		exists             bool
		taps               []intent.TapPolicy
		wantKind           error // nil: a bad value (400)
		want               string
	}{
		{name: "another subnet of its farm", farm: "blue", subnet: "db", exists: true,
			taps: tap("blue/web", "any", "blue/ops/mon")},
		{name: "another farm, even one that exists", farm: "red", subnet: "web", exists: true,
			want: "vm blue/web/web1 is in farm blue and cannot move to red/web: a VM moves only within its farm"},
		{name: "its own subnet", farm: "blue", subnet: "web", exists: true, wantKind: ErrConflict,
			want: "already in subnet blue/web: leave the subnet out to move it to another host only"},
		{name: "a subnet that does not exist", farm: "blue", subnet: "nope",
			want: `no subnet "blue/nope" in farm blue`},
		{name: "named as a tap's sender", farm: "blue", subnet: "db", exists: true, taps: tap("blue/web/web1", "any", "blue/ops/mon"),
			wantKind: ErrConflict, want: `tap policy "t1" names vm blue/web/web1 as its sender`},
		{name: "named as a tap's monitor", farm: "blue", subnet: "db", exists: true, taps: tap("any", "any", "blue/web/web1"),
			wantKind: ErrConflict, want: "as its monitor"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkSubnetMove(web1, tc.farm, tc.subnet, tc.exists, tc.taps)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field != "subnet" || !strings.Contains(fe.Msg, tc.want) {
				t.Fatalf("got %v, want an error on field subnet containing %q", err, tc.want)
			}
			if !errors.Is(err, ErrConflict) != (tc.wantKind == nil) || (tc.wantKind != nil && !errors.Is(err, tc.wantKind)) {
				t.Fatalf("got kind of %v, want %v", err, tc.wantKind)
			}
		})
	}
}

func TestSubnetRefMustBeFarmSlashSubnet(t *testing.T) {
	for _, ref := range []string{"db", "blue/", "/db", "blue/db/x", "Blue/db", "blue/d b", ""} {
		if _, _, err := parseSubnetRef(ref); err == nil || !strings.HasPrefix(err.Error(), "subnet: ") {
			t.Errorf("%q: got %v, want an error on field subnet", ref, err)
		}
	}
	if f, s, err := parseSubnetRef("blue/db"); err != nil || f != "blue" || s != "db" {
		t.Errorf("blue/db: %q %q %v", f, s, err)
	}
}

// A move to another subnet gives the VM an address there, with the MAC and
// gateway that follow from it, frees the old one, and every host's desired
// state follows: the new host serves the VM (its endpoint is what DHCP
// answers and anti-spoofing check), the old one no longer does.
func TestAPIMoveToAnotherSubnetReaddressesTheVMAndDesiredStateFollows(t *testing.T) {
	c, s := newController()
	putHost(t, s, "h1")
	putHost(t, s, "h2")
	srv := httptest.NewServer(c.API())
	t.Cleanup(srv.Close)
	mustCall(t, srv, "POST", "/v1/farms", `{"name":"blue"}`, 201)
	mustCall(t, srv, "POST", "/v1/farms", `{"name":"red"}`, 201)
	for _, sn := range []string{"web", "db"} {
		mustCall(t, srv, "POST", "/v1/farms/blue/subnets", `{"name":"`+sn+`"}`, 201)
	}
	mustCall(t, srv, "POST", "/v1/farms/red/subnets", `{"name":"web"}`, 201)
	mustCall(t, srv, "POST", "/v1/farms/blue/subnets/web/vms", `{"name":"web1","host":"h1"}`, 201)
	mustCall(t, srv, "POST", "/v1/farms/blue/subnets/db/vms", `{"name":"db1","host":"h2"}`, 201)
	mustCall(t, srv, "POST", "/v1/farms/blue/subnets/web/vms/web1/firewall", `{"defaultIn":"deny"}`, 200)

	const path = "/v1/farms/blue/subnets/web/vms/web1/host"
	for _, tc := range []struct {
		body  string
		code  int
		field string
	}{
		{`{"host":"h2","subnet":"red/web"}`, 400, "subnet"},
		{`{"host":"h2","subnet":"blue/web"}`, 409, "subnet"},
		{`{"host":"h2","subnet":"blue/nope"}`, 400, "subnet"},
		{`{"host":"h2","subnet":"db"}`, 400, "subnet"},
		{`{"host":"h9","subnet":"blue/db"}`, 400, "host"},
	} {
		if code, out := call(t, srv, "PUT", path, tc.body); code != tc.code || out["field"] != tc.field {
			t.Errorf("%s: %d %v, want %d on %s", tc.body, code, out, tc.code, tc.field)
		}
	}
	if got := vms(t, s)["web1"]; got.Subnet != "web" || got.IP != "10.1.1.2" || got.Host != "h1" {
		t.Fatalf("a refused move changed web1: %+v", got)
	}

	out := mustCall(t, srv, "PUT", path, `{"host":"h2","subnet":"blue/db"}`, 200)
	want := map[string]any{"farm": "blue", "subnet": "db", "host": "h2", "ip": "10.1.2.3",
		"mac": "02:00:0a:01:02:03", "gateway": "10.1.2.1", "interface": intent.VifName("blue", "web1")}
	for k, v := range want {
		if out[k] != v {
			t.Errorf("moved web1 %s = %v, want %v", k, out[k], v)
		}
	}
	if fw, _ := out["firewall"].(map[string]any); fw == nil || fw["defaultIn"] != "deny" {
		t.Errorf("web1's firewall did not go with it: %v", out["firewall"])
	}
	if _, err := s.Get(t.Context(), intent.VMsPrefix+"blue/web/web1"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the old record blue/web/web1 is still there (err %v)", err)
	}
	// A controller started afresh reads the allocations from the store.
	a, err := New(s, slog.New(slog.DiscardHandler)).alloc(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := a.VMs["blue/web/web1"]; ok || a.VMs["blue/db/web1"] != 3 {
		t.Errorf("allocations after the move: %v", a.VMs)
	}
	// The old address is free again: the next VM of blue/web takes it.
	if out := mustCall(t, srv, "POST", "/v1/farms/blue/subnets/web/vms", `{"name":"web2","host":"h1"}`, 201); out["ip"] != "10.1.1.2" {
		t.Errorf("the next VM of blue/web got %v, want the freed 10.1.1.2", out["ip"])
	}

	if _, err := c.CompileOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	local := func(host string) map[string]intent.LocalEndpoint { return desiredLocal(t, s, host) }
	if l, ok := local("h2")["blue/db/web1"]; !ok || l.IP != "10.1.2.3" || l.MAC != "02:00:0a:01:02:03" || l.Interface != intent.VifName("blue", "web1") {
		t.Errorf("h2's endpoint for web1: %+v (present %v)", l, ok)
	}
	if l, ok := local("h1")["blue/web/web1"]; ok {
		t.Errorf("h1 still serves web1: %+v", l)
	}

	// Back to its first subnet, on the same host: a new address again (its
	// old one went to web2 meanwhile).
	out = mustCall(t, srv, "PUT", "/v1/farms/blue/subnets/db/vms/web1/host", `{"host":"h2","subnet":"blue/web"}`, 200)
	if out["ip"] != "10.1.1.3" || out["host"] != "h2" {
		t.Errorf("back to blue/web on h2: %v", out)
	}
}

// desiredLocal is host's VMs as its desired state holds them, by name.
func desiredLocal(t *testing.T, s store.Store, host string) map[string]intent.LocalEndpoint {
	t.Helper()
	d, _, err := desired.Read(t.Context(), s, host)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]intent.LocalEndpoint{}
	for _, l := range d.Local {
		m[l.Name] = l
	}
	return m
}
