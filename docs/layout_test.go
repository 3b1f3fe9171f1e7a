// Package docs holds the tests that keep the documentation true to the
// tree: README's layout against `go list` and bpf/*.c, and the demos' notes
// against the e2e tests they name.
package docs

import (
	"bufio"
	"errors"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// root is the module's root, this package's parent.
const root = ".."

// layoutEntry is one path README's layout section lists, with its line.
type layoutEntry struct {
	path string
	line int
}

// entryRe is a line of the layout list: "- `PATH`: what it is for".
var entryRe = regexp.MustCompile("^- `([^`]+)`")

// readmeLayout returns the paths README.md lists under "## Layout", in
// order. Only list lines that start with a path in backticks count; prose
// around them is free.
func readmeLayout(t *testing.T) []layoutEntry {
	t.Helper()
	f, err := os.Open(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []layoutEntry
	in := false
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if strings.HasPrefix(line, "## ") {
			in = line == "## Layout"
			continue
		}
		if m := entryRe.FindStringSubmatch(line); in && m != nil {
			out = append(out, layoutEntry{path: m[1], line: n})
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatal("README.md has no \"## Layout\" section listing paths as \"- `PATH`: ...\"")
	}
	return out
}

// packageDirs returns every Go package of the module as a directory
// relative to its root, with a trailing slash ("internal/agent/").
func packageDirs(t *testing.T) map[string]bool {
	t.Helper()
	abs, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	// go test puts its own go first in PATH, so this is the same toolchain.
	cmd := exec.Command("go", "list", "-f", "{{.Dir}}", "./...")
	cmd.Dir = abs
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list ./...: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list ./...: %v", err)
	}
	dirs := map[string]bool{}
	for _, dir := range strings.Fields(string(out)) {
		rel, err := filepath.Rel(abs, dir)
		if err != nil {
			t.Fatal(err)
		}
		dirs[filepath.ToSlash(rel)+"/"] = true
	}
	return dirs
}

// bpfEntries returns the eBPF entry files, bpf/*.c.
func bpfEntries(t *testing.T) map[string]bool {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, "bpf", "*.c"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, f := range files {
		out["bpf/"+filepath.Base(f)] = true
	}
	return out
}

// README's layout names every package and every eBPF entry file once, and
// nothing that is gone: a new package or entry file adds its line, a
// removed or renamed one takes its line along.
func TestReadmeLayoutListsEveryPackageAndBPFEntryFile(t *testing.T) {
	listed := map[string]int{} // path -> README line
	for _, e := range readmeLayout(t) {
		if prev, dup := listed[e.path]; dup {
			t.Errorf("README.md:%d: %s is listed again (first on line %d)", e.line, e.path, prev)
		}
		listed[e.path] = e.line
	}
	pkgs, entries := packageDirs(t), bpfEntries(t)
	if len(pkgs) < 10 || len(entries) < 2 {
		t.Fatalf("found %d packages and %d bpf/*.c files: is the test running in docs/?", len(pkgs), len(entries))
	}

	for _, want := range []struct {
		what  string
		paths map[string]bool
	}{{"package", pkgs}, {"eBPF entry file", entries}} {
		for _, p := range slices.Sorted(maps.Keys(want.paths)) {
			if _, ok := listed[p]; !ok {
				t.Errorf("README.md's layout does not list %s %s: add a line \"- `%s`: what it is for\"", want.what, p, p)
			}
		}
	}

	for _, path := range slices.Sorted(maps.Keys(listed)) {
		line := listed[path]
		switch {
		case isCodeDir(path) && !pkgs[path]:
			t.Errorf("README.md:%d: %s is not a Go package (any more?): remove or rename its line", line, path)
		case strings.HasPrefix(path, "bpf/") && strings.HasSuffix(path, ".c") && !entries[path]:
			t.Errorf("README.md:%d: %s is not a bpf/*.c entry file (any more?): remove or rename its line", line, path)
		default:
			if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(path))); err != nil {
				t.Errorf("README.md:%d: %s does not exist: remove or rename its line", line, path)
			}
		}
	}
}

// isCodeDir reports whether path is a directory under one of the trees
// whose directories are Go packages.
func isCodeDir(path string) bool {
	if !strings.HasSuffix(path, "/") {
		return false
	}
	for _, tree := range []string{"cmd/", "internal/", "bench/", "test/"} {
		if strings.HasPrefix(path, tree) {
			return true
		}
	}
	return false
}
