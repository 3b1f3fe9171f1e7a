package controller

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// openAPIDoc is the part of api/openapi.yaml the tests read.
type openAPIDoc struct {
	Tags []struct {
		Name string `yaml:"name"`
	} `yaml:"tags"`
	Paths map[string]map[string]yaml.Node `yaml:"paths"` // method (or "parameters") -> operation
}

// operation is the part of one operation the tests read.
type operation struct {
	Tags        []string       `yaml:"tags"`
	RequestBody any            `yaml:"requestBody"`
	Responses   map[string]any `yaml:"responses"`
}

func decodeOp(t *testing.T, op yaml.Node) operation {
	t.Helper()
	var o operation
	if err := op.Decode(&o); err != nil {
		t.Fatalf("api/openapi.yaml line %d: %v", op.Line, err)
	}
	return o
}

// An operation that reads a body documents what decode answers: 400 and 413.
func TestOpenAPIDocumentsBodyErrors(t *testing.T) {
	doc, _ := readOpenAPI(t)
	for path, ops := range doc.Paths {
		for method, node := range ops {
			if method == "parameters" {
				continue
			}
			op := decodeOp(t, node)
			if op.RequestBody == nil {
				continue
			}
			for _, code := range []string{"400", "413"} {
				if op.Responses[code] == nil {
					t.Errorf("%s %s reads a body but does not document %s", strings.ToUpper(method), path, code)
				}
			}
		}
	}
}

// servedRoutes maps "METHOD /v1/..." to the file that registers it: api.go
// or api_NOUN.go.
func servedRoutes(t *testing.T) map[string]string {
	t.Helper()
	files, err := filepath.Glob("api*.go")
	if err != nil {
		t.Fatal(err)
	}
	routes := map[string]string{}
	re := regexp.MustCompile(`HandleFunc\("([A-Z]+) (/v1[^"]*)"`)
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range re.FindAllStringSubmatch(string(src), -1) {
			routes[m[1]+" "+m[2]] = f
		}
	}
	if len(routes) < 14 {
		t.Fatalf("found %d routes in %v, want at least the 14 of today", len(routes), files)
	}
	return routes
}

func readOpenAPI(t *testing.T) (openAPIDoc, []byte) {
	t.Helper()
	b, err := os.ReadFile("../../api/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc openAPIDoc
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatalf("api/openapi.yaml: %v", err)
	}
	return doc, b
}

// The document and the router must name the same operations.
func TestOpenAPIDocumentsEveryRoute(t *testing.T) {
	doc, _ := readOpenAPI(t)
	documented := map[string]bool{}
	for path, ops := range doc.Paths {
		for method := range ops {
			if method != "parameters" {
				documented[strings.ToUpper(method)+" "+path] = true
			}
		}
	}
	for key := range servedRoutes(t) {
		if !documented[key] {
			t.Errorf("route %s is not in api/openapi.yaml", key)
		}
		delete(documented, key)
	}
	for key := range documented {
		t.Errorf("api/openapi.yaml documents %s, which the controller does not serve", key)
	}
}

// Each noun is one tag, one handler file (api_NOUN.go) and one contiguous run
// of paths in the document, so a feature's API is found in one place.
func TestOpenAPIGroupsOperationsByNounAsTheHandlersAre(t *testing.T) {
	doc, raw := readOpenAPI(t)
	declared := map[string]bool{}
	for _, tag := range doc.Tags {
		declared[tag.Name] = true
	}
	routes := servedRoutes(t)
	tagOfPath := map[string]string{}
	for path, ops := range doc.Paths {
		for method, op := range ops {
			if method == "parameters" {
				continue
			}
			key := strings.ToUpper(method) + " " + path
			tags := decodeOp(t, op).Tags
			if len(tags) != 1 || !declared[tags[0]] {
				t.Errorf("%s: tags %v, want exactly one of the declared tags", key, tags)
				continue
			}
			if file, ok := routes[key]; ok && file != "api_"+tags[0]+".go" {
				t.Errorf("%s is tagged %s but registered in %s, want api_%s.go", key, tags[0], file, tags[0])
			}
			if prev, ok := tagOfPath[path]; ok && prev != tags[0] {
				t.Errorf("path %s has operations of two nouns, %s and %s", path, prev, tags[0])
			}
			tagOfPath[path] = tags[0]
		}
	}
	// Paths in document order: once a noun's run ends it must not come back.
	var node yaml.Node
	if err := yaml.Unmarshal(raw, &node); err != nil {
		t.Fatal(err)
	}
	var paths *yaml.Node
	for i, n := range node.Content[0].Content {
		if n.Value == "paths" {
			paths = node.Content[0].Content[i+1]
		}
	}
	if paths == nil {
		t.Fatal("api/openapi.yaml has no paths")
	}
	done := map[string]bool{}
	current := ""
	for i := 0; i < len(paths.Content); i += 2 {
		tag := tagOfPath[paths.Content[i].Value]
		if tag != current {
			if done[tag] {
				t.Errorf("path %s (%s) is apart from the other %s paths", paths.Content[i].Value, tag, tag)
			}
			done[current], current = true, tag
		}
	}
}
