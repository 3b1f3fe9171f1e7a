package lab

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/intent"
)

func TestLabRefusesASubnetMoveItCanTellIsWrongBeforeTouchingAnything(t *testing.T) {
	web1 := intent.VM{Farm: "blue", Subnet: "web", Name: "web1"}
	for _, c := range []struct{ to, want string }{
		{"db", `--subnet "db" must be FARM/SUBNET, e.g. blue/db`},
		{"blue/", `must be FARM/SUBNET`},
		{"blue/db/x", `must be FARM/SUBNET`},
		{"red/web", "vm web1 is in farm blue and cannot move to red/web: a VM moves only within its farm"},
		{"blue/web", "vm web1 is already in subnet blue/web: leave out --subnet to move it to another host only"},
	} {
		if err := checkSubnetMove(web1, c.to); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: got %v, want %q", c.to, err, c.want)
		}
	}
	if err := checkSubnetMove(web1, "blue/db"); err != nil {
		t.Errorf("blue/db refused: %v", err)
	}
}

func TestOnlyExternalsAreReaddressed(t *testing.T) {
	st := &State{Name: "t", Kinds: map[string]string{"web1": "vm", "h1": "host", "s1": "sliver"}}
	for node, want := range map[string]string{
		"web1": "web1 is a VM: its address is the controller's; give it a new one with `onehop lab move web1 --to HOST --subnet FARM/SUBNET`",
		"h1":   "h1 is a host: only externals are readdressed",
		"s1":   "s1 is a sliver: only externals are readdressed",
		"nope": `lab "t" has no node "nope"`,
	} {
		if _, _, err := Readdress(st, node); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v, want %q", node, err, want)
		}
	}
}

func TestVNATEndpointsAreRecordedOnceAndShownByStatus(t *testing.T) {
	f := parse(t, `name: t
hosts: [{name: h1}]
farms: [{name: blue, subnets: [{name: web}]}]
vms:
  - {name: web1, host: h1, subnet: blue/web, vnat: true}
  - {name: web2, host: h1, subnet: blue/web}
externals: [{name: inet, vnat: true}, {name: peer}]
`)
	st := &State{Name: "t", Dir: t.TempDir(), Kinds: map[string]string{}}
	// /bin/true stands for the onehop binary: spawn really starts it (it
	// exits at once) and records the daemon as the lab's process.
	b := &builder{t: f, st: st, opts: Options{Binary: "/bin/true"}}
	for _, k := range []nodeKind{vmKind{}, externalKind{}} {
		s, ok := k.(starter)
		if !ok {
			t.Fatalf("kind %s has no start step, the one place its VNAT daemon starts", k.kind())
		}
		for _, n := range k.nodes(f) {
			// Twice: a start asked again records nothing new.
			for range 2 {
				if err := s.start(t.Context(), b, n); err != nil {
					t.Fatal(err)
				}
			}
			st.Namespaces = append(st.Namespaces, NamespaceOf(st.Name, n))
			st.Kinds[n] = k.kind()
		}
	}
	if want := []string{"inet", "web1"}; !slices.Equal(slices.Sorted(slices.Values(st.VNAT)), want) {
		t.Fatalf("VNAT endpoints %v, want %v", st.VNAT, want)
	}
	// One daemon per endpoint, in its namespace, however often start ran.
	var got []string
	for _, p := range st.Processes {
		got = append(got, fmt.Sprintf("%s %s %s %s", p.Name, p.Node, p.Netns, strings.Join(p.Args, " ")))
	}
	want := []string{
		// The VM reaches the location server through its host's relay,
		// the external on the fabric (docs/vnat-location.md).
		"vnat-web1 web1 oh-t-web1 vnat run --iface " + VMInterface + " --location-server 169.254.20.31",
		"vnat-inet inet oh-t-inet vnat run --iface " + ExternalInterface + " --location-server 192.168.100.1",
	}
	if !slices.Equal(got, want) {
		t.Errorf("processes %q, want %q", got, want)
	}
	saved, err := Load(st.Dir[:strings.LastIndexByte(st.Dir, '/')], st.Dir[strings.LastIndexByte(st.Dir, '/')+1:])
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(saved.VNAT, st.VNAT) {
		t.Errorf("saved state has VNAT %v, want %v", saved.VNAT, st.VNAT)
	}
	for _, n := range Status(t.Context(), st).Nodes {
		if want := n.Name == "web1" || n.Name == "inet"; n.VNAT != want {
			t.Errorf("status of %s: vnat %v, want %v", n.Name, n.VNAT, want)
		}
	}
}
