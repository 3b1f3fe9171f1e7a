package cni

import (
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/onehop/onehop/internal/client"
	"github.com/onehop/onehop/internal/controller"
	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/topology"
)

// The plugin's API client against a real controller: it reads one VM by
// its own GET (not the list of every VM in the cloud), and says which of
// farm, subnet and host the controller does not have.
func TestAPIReadsOneVMAndNamesWhatIsMissing(t *testing.T) {
	topo, err := topology.Parse("t.yaml", []byte(`name: t
hosts: [{name: h1}]
farms: [{name: blue, subnets: [{name: web}]}]
vms: [{name: web1, host: h1, subnet: blue/web}]
`))
	if err != nil {
		t.Fatal(err)
	}
	c := controller.New(store.NewMemory(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := c.ApplyTopology(t.Context(), topo); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var asked []string
	api := c.API()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		asked = append(asked, r.Method+" "+r.URL.Path)
		mu.Unlock()
		api.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	a := API{client.New(srv.URL)}

	v, err := a.VM(t.Context(), "blue", "web", "web1")
	if err != nil || v.IP != "10.1.1.2" || v.Host != "h1" {
		t.Fatalf("VM blue/web/web1: %+v, %v", v, err)
	}
	if _, err := a.VM(t.Context(), "blue", "web", "nope"); !errors.Is(err, ErrNoVM) {
		t.Errorf("VM blue/web/nope: %v, want ErrNoVM", err)
	}
	for _, c := range []struct{ farm, subnet, host, want string }{
		{"blue", "web", "h1", ""},
		{"red", "web", "h1", `farm "red": the controller has no such farm`},
		{"blue", "db", "h1", `subnet "db": farm blue has no such subnet`},
		{"blue", "web", "h9", `host "h9": the controller has no such host`},
		{"Blue", "web", "h1", `farm: farm name "Blue" must be lowercase`},
	} {
		missing, err := a.Where(t.Context(), c.farm, c.subnet, c.host)
		if err != nil || (c.want == "") != (missing == "") || !strings.Contains(missing, c.want) {
			t.Errorf("Where(%s, %s, %s) = %q, %v; want %q", c.farm, c.subnet, c.host, missing, err, c.want)
		}
	}
	for _, q := range asked {
		if q == "GET /v1/vms" || q == "GET /v1/farms" || q == "GET /v1/subnets" || q == "GET /v1/hosts" {
			t.Errorf("the plugin listed a whole collection: %s", q)
		}
	}
}
