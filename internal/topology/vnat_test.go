package topology

import (
	"strings"
	"testing"
)

const vnatTopo = `name: t
hosts: [{name: h1}]
farms:
  - name: blue
    subnets: [{name: web}, {name: db}]
externals:
  - {name: inet, vnat: true}
  - {name: peer}
vms:
  - {name: web1, host: h1, subnet: blue/web, vnat: true}
  - {name: web2, host: h1, subnet: blue/web}
  - {name: db1, host: h1, subnet: blue/db, vnat: false}
`

func TestVNATIsReadOnVMsAndExternalsAndOffByDefault(t *testing.T) {
	f, err := Parse("t.yaml", []byte(vnatTopo))
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{"web1": true, "web2": false, "db1": false} {
		if v, _ := f.VMByNode(name); v.VNAT != want {
			t.Errorf("vm %s vnat = %v, want %v", name, v.VNAT, want)
		}
	}
	for name, want := range map[string]bool{"inet": true, "peer": false} {
		if e, _ := f.ExternalByName(name); e.VNAT != want {
			t.Errorf("external %s vnat = %v, want %v", name, e.VNAT, want)
		}
	}
}

// vnatErrorCases are edits of vnatTopo and the error each must give.
var vnatErrorCases = []struct{ name, old, new, want string }{
	{"vm vnat not a bool", "subnet: blue/web, vnat: true}", "subnet: blue/web, vnat: maybe}", `t.yaml:10: vm vnat must be true or false`},
	{"external vnat not a bool", "{name: inet, vnat: true}", "{name: inet, vnat: 1}", `t.yaml:7: external vnat must be true or false`},
	{"vnat given twice", "{name: inet, vnat: true}", "{name: inet, vnat: true, vnat: false}", `t.yaml:7: `},
	{"vnat on a host", "hosts: [{name: h1}]", "hosts: [{name: h1, vnat: true}]", `t.yaml:2: unknown key "vnat"`},
}

func TestVNATErrorsNameLineAndReason(t *testing.T) {
	for _, c := range vnatErrorCases {
		t.Run(c.name, func(t *testing.T) {
			topo := strings.Replace(vnatTopo, c.old, c.new, 1)
			if topo == vnatTopo {
				t.Fatalf("edit %q found nothing to replace", c.old)
			}
			_, err := Parse("t.yaml", []byte(topo))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want %q", err, c.want)
			}
			checkErrorLines(t, err)
		})
	}
}
