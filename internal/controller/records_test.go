package controller

import (
	"errors"
	"go/ast"
	"go/constant"
	"go/parser"
	"go/token"
	"go/types"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
)

// intentConstants returns the string constants package intent declares
// that keep accepts, name by value, read from its source: a key layout
// added there shows up here without anyone listing it.
func intentConstants(t *testing.T, keep func(name, v string) bool) map[string]string {
	t.Helper()
	dir := filepath.Join("..", "intent")
	fset := token.NewFileSet()
	names, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	// Constants need nothing imported: type-check without the imports
	// and ignore what they leave undefined.
	conf := types.Config{
		Importer: importerFunc(func(string) (*types.Package, error) { return nil, errors.New("not needed") }),
		Error:    func(error) {},
	}
	pkg, _ := conf.Check("intent", fset, files, nil)
	out := map[string]string{}
	for _, name := range pkg.Scope().Names() {
		c, ok := pkg.Scope().Lookup(name).(*types.Const)
		if !ok || c.Val().Kind() != constant.String {
			continue
		}
		if v := constant.StringVal(c.Val()); keep(name, v) {
			out[v] = name
		}
	}
	return out
}

// count is how many of xs f holds for.
func count[T any](xs []T, f func(T) bool) int {
	n := 0
	for _, x := range xs {
		if f(x) {
			n++
		}
	}
	return n
}

type importerFunc func(path string) (*types.Package, error)

func (f importerFunc) Import(path string) (*types.Package, error) { return f(path) }

func loadedModel() *model {
	m := &model{}
	m.reset()
	m.loaded = true
	return m
}

// Every kind of record intent lays out under its prefix is kept by exactly
// one kind the model registers, and every registered kind is one intent
// lays out: no record is dropped unseen, none claimed twice, and no key
// layout lives in the controller.
func TestEveryIntentRecordLayoutIsClaimedByExactlyOneRecordKind(t *testing.T) {
	m := loadedModel()
	layouts := intentConstants(t, func(_, v string) bool { return strings.HasPrefix(v, intent.Prefix) && v != intent.Prefix })
	if layouts[intent.HostsPrefix] != "HostsPrefix" || len(layouts) < 8 {
		t.Fatalf("read %d record layouts from intent, HostsPrefix not among them: %v", len(layouts), layouts)
	}
	for v, name := range layouts {
		if n := count(m.kinds, func(k recordKind) bool { return k.prefix == v || k.key == v }); n != 1 {
			t.Errorf("intent.%s (%s) is claimed by %d record kinds, want 1: add its kind to recordKinds or to its part (records.go)", name, v, n)
		}
	}
	for i, k := range m.kinds {
		at := k.prefix + k.key
		if (k.prefix == "") == (k.key == "") {
			t.Errorf("record kind %d has prefix %q and key %q: want exactly one", i, k.prefix, k.key)
		}
		if _, ok := layouts[at]; !ok {
			t.Errorf("record kind %d claims %q, which intent does not lay out", i, at)
		}
		for j, o := range m.kinds {
			if j != i && o.prefix != "" && strings.HasPrefix(at, o.prefix) {
				t.Errorf("record kinds %d (%s) and %d (%s) overlap", i, at, j, o.prefix)
			}
		}
	}
}

// Every kind of desired key intent names is written by exactly one part,
// and every part's kind is one intent names.
func TestEveryKindOfDesiredKeyIsWrittenByExactlyOnePart(t *testing.T) {
	m := loadedModel()
	isKind := regexp.MustCompile(`^Desired\w+Kind$`)
	kinds := intentConstants(t, func(name, _ string) bool { return isKind.MatchString(name) })
	if kinds[intent.DesiredVMKind] != "DesiredVMKind" || len(kinds) < 3 {
		t.Fatalf("read %d kinds of desired key from intent, DesiredVMKind not among them: %v", len(kinds), kinds)
	}
	for v, name := range kinds {
		if n := count(m.parts, func(p part) bool { return p.desiredKind() == v }); n != 1 {
			t.Errorf("intent.%s (%q) is written by %d parts, want 1", name, v, n)
		}
	}
	for _, p := range m.parts {
		if k := p.desiredKind(); k != "" && kinds[k] == "" {
			t.Errorf("part %T writes desired keys of kind %q, which intent does not name", p, k)
		}
	}
}

// partOf returns the model's part of type P.
func partOf[P part](t *testing.T, m *model) P {
	t.Helper()
	for _, p := range m.parts {
		if p, ok := p.(P); ok {
			return p
		}
	}
	var zero P
	t.Fatalf("no part %T registered", zero)
	return zero
}

// A record of every registered kind reaches the model when written and
// leaves it when deleted; one that does not decode is refused naming its
// key. The table must cover every kind registered.
func TestARecordOfEveryKindReachesTheModel(t *testing.T) {
	rows := []struct {
		key, value string
		has        func(m *model) bool
	}{
		{intent.AllocKey, `{"farms":{"blue":1},"subnets":{"blue/web":1}}`,
			func(m *model) bool { return m.allocFarms["blue"] == 1 && m.allocSubnets["blue/web"] == 1 }},
		{intent.VMIDsPrefix + "blue/web", `{"a":2}`,
			func(m *model) bool { return m.vmids["blue/web"]["a"] == 2 }},
		{intent.HostsPrefix + "h1", `{"name":"h1"}`,
			func(m *model) bool { _, ok := m.hosts["h1"]; return ok }},
		{intent.FarmsPrefix + "blue", `{"name":"blue","id":1}`,
			func(m *model) bool { return m.farms["blue"].ID == 1 }},
		{intent.SubnetKey("blue", "web"), `{"farm":"blue","name":"web","id":1}`,
			func(m *model) bool { return m.subnets["blue/web"].ID == 1 }},
		{intent.VMKey("blue", "web", "a"), `{"farm":"blue","subnet":"web","name":"a","host":"h1","ip":"10.1.1.2"}`,
			func(m *model) bool {
				return m.vms["blue/web/a"].IP == "10.1.1.2" && m.namedIn("blue", "a") == "blue/web/a" && m.onHost["h1"]["blue/web/a"]
			}},
		{intent.SliverKey("h1", "s1"), `{"host":"h1","name":"s1","slot":1}`,
			func(m *model) bool { return partOf[*sliverKeys](t, m).slivers["h1/s1"].Slot == 1 }},
		{intent.TapsPrefix + "t1", `{"name":"t1","id":3}`,
			func(m *model) bool { return partOf[*tapKeys](t, m).policies["t1"].ID == 3 }},
		{intent.TapCapturesPrefix + "t1", `{"policy":"t1","collector":"192.168.50.1"}`,
			func(m *model) bool { return partOf[*tapKeys](t, m).captures["t1"].Collector == "192.168.50.1" }},
	}
	m := loadedModel()
	covered := make([]bool, len(m.kinds))
	for _, r := range rows {
		i, _, ok := m.kindOf(r.key)
		if !ok {
			t.Fatalf("%s: no record kind claims it", r.key)
		}
		covered[i] = true
		if err := m.apply(r.key, []byte(r.value), false); err != nil {
			t.Fatalf("%s: %v", r.key, err)
		}
		if !r.has(m) {
			t.Errorf("%s written: the model does not hold it", r.key)
		}
		if _, err := m.compile(t.Context(), store.NewMemory()); err != nil {
			t.Fatalf("%s: compile: %v", r.key, err)
		}
		if err := m.apply(r.key, nil, true); err != nil {
			t.Fatalf("%s deleted: %v", r.key, err)
		}
		if r.has(m) {
			t.Errorf("%s deleted: the model still holds it", r.key)
		}
		if err := m.apply(r.key, []byte("{"), false); err == nil || !strings.Contains(err.Error(), r.key) {
			t.Errorf("%s holding a value that does not decode: error %v, want one naming the key", r.key, err)
		}
	}
	for i, ok := range covered {
		if !ok {
			t.Errorf("record kind %s%s has no row in this test", m.kinds[i].prefix, m.kinds[i].key)
		}
	}
}
