package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"
)

// The demos show what the e2e tests assert, and name the test beside each
// step (scripts/lib.sh): every test they name exists in test/e2e.
func TestDemosNameOnlyE2ETestsThatExist(t *testing.T) {
	tests := map[string]bool{}
	files, err := filepath.Glob(filepath.Join(root, "test", "e2e", "*_test.go"))
	if err != nil {
		t.Fatal(err)
	}
	funcRe := regexp.MustCompile(`(?m)^func (Test\w+)\(`)
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range funcRe.FindAllStringSubmatch(string(b), -1) {
			tests[m[1]] = true
		}
	}
	if len(tests) == 0 {
		t.Fatal("no tests found in test/e2e")
	}
	scripts, err := filepath.Glob(filepath.Join(root, "scripts", "*.sh"))
	if err != nil {
		t.Fatal(err)
	}
	nameRe := regexp.MustCompile(`\bTest[A-Z]\w+`)
	named := 0
	for _, s := range scripts {
		b, err := os.ReadFile(s)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range nameRe.FindAllString(string(b), -1) {
			named++
			if !tests[name] {
				t.Errorf("%s names %s, which is not a test in test/e2e (renamed?)", filepath.Base(s), name)
			}
		}
	}
	if named == 0 {
		t.Error("no demo names the e2e test that asserts what it shows")
	}
}
