package controller

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// The document and the router must name the same operations.
func TestOpenAPIDocumentsEveryRoute(t *testing.T) {
	b, err := os.ReadFile("../../api/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Paths map[string]map[string]any `yaml:"paths"`
	}
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatalf("api/openapi.yaml: %v", err)
	}
	documented := map[string]bool{}
	for path, ops := range doc.Paths {
		for method := range ops {
			if method != "parameters" {
				documented[strings.ToUpper(method)+" "+path] = true
			}
		}
	}
	src, err := os.ReadFile("api.go")
	if err != nil {
		t.Fatal(err)
	}
	routes := regexp.MustCompile(`HandleFunc\("([A-Z]+) (/v1[^"]*)"`).FindAllStringSubmatch(string(src), -1)
	if len(routes) == 0 {
		t.Fatal("no routes found in api.go")
	}
	for _, r := range routes {
		key := r[1] + " " + r[2]
		if !documented[key] {
			t.Errorf("route %s is not in api/openapi.yaml", key)
		}
		delete(documented, key)
	}
	for key := range documented {
		t.Errorf("api/openapi.yaml documents %s, which the controller does not serve", key)
	}
}
