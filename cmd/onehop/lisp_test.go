package main

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/controller"
	"github.com/onehop/onehop/internal/store"
)

func lispController(t *testing.T) string {
	t.Helper()
	c := controller.New(store.NewMemory(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	srv := httptest.NewServer(c.API())
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestCLILispMapAddListDelete(t *testing.T) {
	addr := lispController(t)
	steps := []cliStep{
		{[]string{"lisp", "map", "add", "10.99.0.0/16", "--rloc", "192.168.100.11,1,50", "--rloc", "192.168.100.12,2"},
			"mapping 10.99.0.0/16: 192.168.100.11 (priority 1, weight 50), 192.168.100.12 (priority 2, weight 100); ttl 1440 min\n", false},
		{[]string{"lisp", "map", "add", "10.96.0.0/16", "--ttl", "15"}, "mapping 10.96.0.0/16: negative, native-forward; ttl 15 min\n", false},
		{[]string{"lisp", "map", "add", "10.99.0.0/16", "--rloc", "192.168.100.13"}, "eid: mapping 10.99.0.0/16: already exists", true},
		{[]string{"lisp", "map", "list"}, "EID           RLOCS (PRIORITY/WEIGHT)                   ACTION          TTL    SOURCE  EXPIRES\n" +
			"10.96.0.0/16  -                                         native-forward  15m    api     -\n" +
			"10.99.0.0/16  192.168.100.11/1/50 192.168.100.12/2/100  no-action       1440m  api     -\n", false},
		{[]string{"lisp", "map", "delete", "10.96.0.0/16"}, "mapping 10.96.0.0/16 deleted\n", false},
		{[]string{"lisp", "map", "delete", "10.96.0.0/16"}, "eid: mapping 10.96.0.0/16: not found", true},
		{[]string{"lisp", "server"}, "no map-server runs", false},
	}
	runSteps(t, addr, steps)
	out, err := runOut("lisp", "map", "list", "-o", "json", "--api", addr)
	if err != nil {
		t.Fatal(err)
	}
	var list []controller.LISPMapping
	if err := json.Unmarshal([]byte(out), &list); err != nil || len(list) != 1 || list[0].EID != "10.99.0.0/16" ||
		len(list[0].Locators) != 2 || list[0].Locators[1].Priority != 2 {
		t.Fatalf("list -o json: %v %+v\n%s", err, list, out)
	}
}

// Bad arguments are named before the controller is asked (none listens).
func TestCLILispChecksNameTheArgument(t *testing.T) {
	noAPI := []string{"--api", "http://127.0.0.1:1"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"lisp", "map", "add", "10.99.0.0"}, `EID-PREFIX "10.99.0.0": want a prefix such as 10.99.0.0/16`},
		{[]string{"lisp", "map", "add", "10.99.0.1/16"}, "EID-PREFIX 10.99.0.1/16 has host bits set: did you mean 10.99.0.0/16?"},
		{[]string{"lisp", "map", "add", "10.99.0.0/16", "--rloc", "x"}, `--rloc "x": "x" is not an IP address`},
		{[]string{"lisp", "map", "add", "10.99.0.0/16", "--rloc", "192.168.100.11,256"}, `--rloc "192.168.100.11,256": priority "256": want 0-255`},
		{[]string{"lisp", "map", "add", "10.99.0.0/16", "--rloc", "192.168.100.11,1,x"}, `weight "x": want 0-255`},
		{[]string{"lisp", "map", "add", "10.99.0.0/16", "--rloc", "192.168.100.11,1,2,3"}, "want ADDR[,PRIORITY[,WEIGHT]]"},
		{[]string{"lisp", "map", "add", "10.99.0.0/16", "--ttl", "-1"}, "--ttl -1: want 0 to 4294967295 minutes"},
		{[]string{"lisp", "map", "add", "10.99.0.0/16", "--action", "explode"}, `--action: unknown action "explode"`},
		{[]string{"lisp", "map", "delete", "nope"}, `EID-PREFIX "nope"`},
		{[]string{"lisp", "map", "list", "-o", "yaml"}, `invalid argument "yaml" for "-o, --output" flag: want text or json`},
	} {
		_, err := runOut(append(tc.args, noAPI...)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err = %v, want %q", tc.args, err, tc.want)
		}
	}
}
