package controller

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/testenv"
)

// The controller checks intent against capacities (internal/limits) and
// never loads BPF: a controller that imported a loader would need the
// kernel's objects to build and would drift towards the agent's job.
func TestTheControllerDependsOnNoBPFLoader(t *testing.T) {
	testenv.RequireTool(t, "go")
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}{{range .Imports}} {{.}}{{end}}", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	imports := map[string][]string{}
	var root string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		imports[f[0]] = f[1:]
		root = f[0] // -deps lists a package after everything it imports
	}
	if path := importPath(imports, root, "github.com/cilium/ebpf"); path != nil {
		t.Fatalf("the controller loads BPF through %s", strings.Join(path, " -> "))
	}
}

// importPath is a chain of imports from root to a package under prefix,
// nil when there is none.
func importPath(imports map[string][]string, root, prefix string) []string {
	from := map[string]string{root: ""}
	queue := []string{root}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if p == prefix || strings.HasPrefix(p, prefix+"/") {
			var path []string
			for ; p != ""; p = from[p] {
				path = append([]string{p}, path...)
			}
			return path
		}
		for _, q := range imports[p] {
			if _, seen := from[q]; !seen {
				from[q] = p
				queue = append(queue, q)
			}
		}
	}
	return nil
}
