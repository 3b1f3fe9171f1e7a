package lab

import (
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/topology"
)

// sameNameState is a lab in which blue and red each have a web1 (nodes
// blue/web1 and red/web1, as lab up makes them: topology.File.VMNode) and
// web2 is blue's only.
func sameNameState() *State {
	vm := func(farm, subnet, name string) intent.VM {
		return intent.VM{Farm: farm, Subnet: subnet, Name: name, Host: "h1"}
	}
	return &State{Name: "t",
		Kinds: map[string]string{"h1": "host", "blue/web1": "vm", "red/web1": "vm", "web2": "vm"},
		VMs:   []intent.VM{vm("blue", "web", "web1"), vm("red", "web", "web1"), vm("blue", "web", "web2")}}
}

// A command names a VM by its name when one farm has it, and as FARM/VM or
// FARM/SUBNET/VM always; a name two farms have is refused with both named.
func TestLabNodeOfANameTwoFarmsShare(t *testing.T) {
	st := sameNameState()
	for name, want := range map[string]string{
		"h1": "h1", "web2": "web2", "blue/web2": "web2", "blue/web/web2": "web2",
		"blue/web1": "blue/web1", "red/web1": "red/web1", "red/web/web1": "red/web1", "blue/web/web1": "blue/web1",
	} {
		if got, err := st.Node(name); err != nil || got != want {
			t.Errorf("Node(%q) = %q, %v; want %q", name, got, err, want)
		}
	}
	for name, want := range map[string]string{
		"web1":         `lab "t" has 2 VMs named "web1", in different farms: say which, as FARM/VM or FARM/SUBNET/VM (blue/web/web1, red/web/web1)`,
		"web3":         `lab "t" has no node or VM "web3"`,
		"red/web2":     `lab "t" has no node or VM "red/web2"`,
		"blue/db/web1": `lab "t" has no node or VM "blue/db/web1"`,
		"a/b/c/d":      `"a/b/c/d": a node is NAME, and a VM also FARM/VM or FARM/SUBNET/VM`,
	} {
		if got, err := st.Node(name); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Node(%q) = %q, %v; want an error containing %q", name, got, err, want)
		}
	}
}

// The namespace of node FARM/VM is a file name, and reads back as the node.
func TestLabNamespaceOfAQualifiedNodeIsAFileNameAndReadsBack(t *testing.T) {
	for _, node := range []string{"web1", "blue/web1", "a-farm/web1", "h1"} {
		ns := NamespaceOf("t", node)
		if strings.Contains(ns, "/") || nodeOf("t", ns) != node {
			t.Errorf("node %q: namespace %q, read back as %q", node, ns, nodeOf("t", ns))
		}
	}
	if NamespaceOf("t", "blue/web1") == NamespaceOf("t", "red/web1") {
		t.Error("blue/web1 and red/web1 share a namespace")
	}
	if NamespaceOf("t", "web1") != "oh-t-web1" {
		t.Errorf("a VM of a name one farm has moved namespace: %s", NamespaceOf("t", "web1"))
	}
}

// lab up's nodes are the topology's VMNode: the VMs of a name two farms
// have are FARM/VM, the state finds each by its record.
func TestLabVMNodesFollowTheTopology(t *testing.T) {
	f, err := topology.Parse("t.yaml", []byte(`name: t
hosts: [{name: h1}]
farms: [{name: blue, subnets: [{name: web}]}, {name: red, subnets: [{name: web}]}]
vms:
  - {name: web1, host: h1, subnet: blue/web}
  - {name: web1, host: h1, subnet: red/web}
  - {name: web2, host: h1, subnet: blue/web}
`))
	if err != nil {
		t.Fatal(err)
	}
	st := sameNameState()
	got := vmKind{}.nodes(f)
	if strings.Join(got, " ") != "blue/web1 red/web1 web2" {
		t.Fatalf("vm nodes %v", got)
	}
	for i, v := range st.VMs {
		if st.VMNode(v) != got[i] {
			t.Errorf("state's node of %s: %q, the topology's %q", v.FullName(), st.VMNode(v), got[i])
		}
	}
}
