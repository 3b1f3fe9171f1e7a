package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/onehop/onehop/internal/client"
)

// `onehop get KIND -o json` prints through the writer it is given, as the
// text table does (printJSON used to write to the process's stdout
// whatever the writer).
func TestListingAsJSONGoesToItsWriter(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/things" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`[{"name":"a"},{"name":"b"}]`))
	}))
	defer srv.Close()
	type thing struct {
		Name string `json:"name"`
	}
	var out bytes.Buffer
	err := listAndPrint(client.New(srv.URL), "/v1/things", "json", &out, "NAME", func(v thing) string { return v.Name })
	if err != nil {
		t.Fatal(err)
	}
	var got []thing
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("the writer holds %q, not the JSON list: %v", out.String(), err)
	}
	if len(got) != 2 || got[0].Name != "a" || got[1].Name != "b" {
		t.Fatalf("printed %+v, want a and b", got)
	}
}
