package controller

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/onehop/onehop/internal/desired"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
)

// tapTopo: blue (web, db, ops) and red (app) peer with each other; green
// peers with nobody. Addresses: web1 10.1.1.2, web2 10.1.1.3, db1
// 10.1.2.2, mon 10.1.3.2, app1 10.2.1.2, rmon 10.2.1.3, gr1 10.3.1.2.
const tapTopo = `name: t
hosts: [{name: h1}, {name: h2}, {name: h3}]
farms:
  - name: blue
    subnets: [{name: web}, {name: db}, {name: ops}]
    peers: [red]
  - name: red
    subnets: [{name: app}]
    peers: [blue]
  - name: green
    subnets: [{name: lan}]
vms:
  - {name: web1, host: h1, subnet: blue/web}
  - {name: web2, host: h2, subnet: blue/web}
  - {name: db1, host: h2, subnet: blue/db}
  - {name: mon, host: h3, subnet: blue/ops}
  - {name: app1, host: h1, subnet: red/app}
  - {name: rmon, host: h3, subnet: red/app}
  - {name: gr1, host: h1, subnet: green/lan}
`

func tapServer(t *testing.T) (*Controller, *store.Memory, *http.Client, string) {
	t.Helper()
	c, s := newController()
	if err := c.ApplyTopology(t.Context(), parse(t, tapTopo)); err != nil {
		t.Fatal(err)
	}
	srv := newAPIServer(t, c)
	return c, s, srv.Client(), srv.URL
}

func TestAPICreatesTapsWithLowestFreeIDsAndVMsByName(t *testing.T) {
	c, s, _, _ := tapServer(t)
	srv := newAPIServer(t, c)
	// The sender by IP, the receiver by MAC, the monitor by IP: stored by name.
	out := mustCall(t, srv, "POST", "/v1/taps",
		`{"name":"web-http","sender":"10.1.1.2","receiver":"02:00:0a:01:02:02","monitor":"10.1.3.2","proto":6,"dportLo":80,"dportHi":80}`, 201)
	if out["id"] != 1.0 || out["sender"] != "blue/web/web1" || out["receiver"] != "blue/db/db1" || out["monitor"] != "blue/ops/mon" ||
		out["filter"] != "proto tcp dport 80" || out["problem"] != nil {
		t.Fatalf("web-http: %v", out)
	}
	out = mustCall(t, srv, "POST", "/v1/taps", `{"name":"all","sender":"any","receiver":"any","monitor":"blue/ops/mon","bothDirections":true}`, 201)
	if out["id"] != 2.0 || out["filter"] != "all traffic" || out["bothDirections"] != true {
		t.Fatalf("all: %v", out)
	}
	mustCall(t, srv, "POST", "/v1/taps", `{"name":"cross","sender":"red/app/app1","receiver":"blue/web","monitor":"blue/ops/mon","crossFarm":true}`, 201)
	// A PUT keeps the id; a delete frees it for the next.
	out = mustCall(t, srv, "PUT", "/v1/taps/all", `{"sender":"blue/web","receiver":"any","monitor":"blue/ops/mon","vlan":257}`, 200)
	if out["id"] != 2.0 || out["sender"] != "blue/web" || out["vlan"] != 257.0 || out["bothDirections"] != nil {
		t.Fatalf("put all: %v", out)
	}
	mustCall(t, srv, "DELETE", "/v1/taps/web-http", ``, 204)
	if out = mustCall(t, srv, "POST", "/v1/taps", `{"name":"db","sender":"blue/db","receiver":"any","monitor":"blue/ops/mon"}`, 201); out["id"] != 1.0 {
		t.Fatalf("db after web-http left: %v, want id 1", out)
	}
	if out = mustCall(t, srv, "GET", "/v1/taps/cross", ``, 200); out["id"] != 3.0 || out["crossFarm"] != true {
		t.Fatalf("get cross: %v", out)
	}
	resp, err := http.Get(srv.URL + "/v1/taps")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list []TapView
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil || resp.StatusCode != 200 {
		t.Fatalf("list: %d %v", resp.StatusCode, err)
	}
	var got []string
	for _, v := range list {
		got = append(got, fmt.Sprintf("%s#%d", v.Name, v.ID))
	}
	if strings.Join(got, " ") != "all#2 cross#3 db#1" {
		t.Fatalf("list: %v", got)
	}

	// The hosts' desired state carries the rules: h1 (web1, app1) is a
	// sender's edge of all (blue/web) and cross (app1), h2 (web2, db1) of
	// all and db, h3 the monitor's edge of all three.
	if _, err := c.CompileOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	rules := func(host string) string {
		var d intent.Desired
		if d, _, err = desired.Read(t.Context(), s, host); err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, r := range d.Taps {
			out = append(out, fmt.Sprintf("%s#%d>%s", r.Policy, r.ID, r.MonitorHost))
		}
		return strings.Join(out, " ")
	}
	if got := rules("h1"); got != "all#2>h3 cross#3>h3" {
		t.Errorf("h1 rules %q", got)
	}
	if got := rules("h2"); got != "db#1>h3 all#2>h3" {
		t.Errorf("h2 rules %q", got)
	}
	if got := rules("h3"); got != "db#1>h3 all#2>h3 cross#3>h3" {
		t.Errorf("h3 rules %q", got)
	}
	// Moving the monitor recompiles every sender's edge: copies go to h2.
	mustCall(t, srv, "PUT", "/v1/farms/blue/subnets/ops/vms/mon/host", `{"host":"h2"}`, 200)
	if _, err := c.CompileOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got, got3 := rules("h1"), rules("h3"); got != "all#2>h2 cross#3>h2" || got3 != "" {
		t.Errorf("after the monitor moved: h1 %q, h3 %q", got, got3)
	}
	// Deleting every policy leaves no rule on any host.
	for _, n := range []string{"all", "cross", "db"} {
		mustCall(t, srv, "DELETE", "/v1/taps/"+n, ``, 204)
	}
	if _, err := c.CompileOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"h1", "h2", "h3"} {
		if got := rules(h); got != "" {
			t.Errorf("host %s after every tap was deleted: %q", h, got)
		}
	}
}

func TestAPITapErrorsNameTheFieldAndTheOtherHolder(t *testing.T) {
	c, _, _, _ := tapServer(t)
	srv := newAPIServer(t, c)
	mustCall(t, srv, "POST", "/v1/taps", `{"name":"one","sender":"blue/web/web1","receiver":"any","monitor":"blue/ops/mon","proto":17}`, 201)
	const mon = `"monitor":"blue/ops/mon"`
	cases := []struct {
		method, path, body string
		code               int
		field, msg         string
	}{
		{"POST", "/v1/taps", `{"name":"Bad","sender":"any","receiver":"any",` + mon + `}`, 400, "name", "1-32 lowercase"},
		{"POST", "/v1/taps", `{"name":"x","sender":"any","receiver":"any",` + mon + `,"id":5}`, 400, "id", "the controller allocates"},
		{"POST", "/v1/taps", `{"name":"x","sender":"blue","receiver":"any",` + mon + `}`, 400, "sender", "want farm/subnet/vm"},
		{"POST", "/v1/taps", `{"name":"x","sender":"blue/web/nope","receiver":"any",` + mon + `}`, 400, "sender", "no vm blue/web/nope"},
		{"POST", "/v1/taps", `{"name":"x","sender":"any","receiver":"10.9.9.9",` + mon + `}`, 400, "receiver", "no VM has address 10.9.9.9"},
		{"POST", "/v1/taps", `{"name":"x","sender":"any","receiver":"any","monitor":"blue/ops"}`, 400, "monitor", "not one VM"},
		{"POST", "/v1/taps", `{"name":"x","sender":"red/app/app1","receiver":"any",` + mon + `}`, 400, "monitor", "unless the policy is cross-farm"},
		{"POST", "/v1/taps", `{"name":"x","sender":"green/lan/gr1","receiver":"any",` + mon + `,"crossFarm":true}`, 400, "monitor", "do not peer"},
		{"POST", "/v1/taps", `{"name":"x","sender":"any","receiver":"any",` + mon + `,"proto":1,"dportLo":80,"dportHi":80}`, 400, "dportLo", "needs proto tcp, udp or any"},
		{"POST", "/v1/taps", `{"name":"x","sender":"any","receiver":"any",` + mon + `,"sportLo":80}`, 400, "sportHi", "without sportHi"},
		{"POST", "/v1/taps", `{"name":"x","sender":"any","receiver":"any",` + mon + `,"proto":300}`, 400, "proto", "want a uint8"},
		{"POST", "/v1/taps", `{"name":"x","sender":"any","receiver":"any",` + mon + `,"vlan":777}`, 400, "vlan", "no subnet has those ids"},
		{"POST", "/v1/taps", `{"name":"x","sender":"any","receiver":"any",` + mon + `,"filter":"x"}`, 400, "filter", "unknown field"},
		{"POST", "/v1/taps", `{"name":"one","sender":"any","receiver":"any",` + mon + `}`, 409, "name", "tap one (id 1, blue/web/web1 -> any, monitor blue/ops/mon): already exists"},
		{"POST", "/v1/taps", `{"name":"two","sender":"10.1.1.2","receiver":"any","monitor":"10.1.3.2","proto":17}`, 409, "body", "tap one copies the same traffic"},
		{"PUT", "/v1/taps/one", `{"name":"two","sender":"any","receiver":"any",` + mon + `}`, 400, "name", "a tap is not renamed"},
		{"PUT", "/v1/taps/one", `{"sender":"any","receiver":"any",` + mon + `,"id":9}`, 400, "id", "has id 1"},
		{"PUT", "/v1/taps/nope", `{"sender":"any","receiver":"any",` + mon + `}`, 404, "name", "tap nope: not found"},
		{"GET", "/v1/taps/nope", ``, 404, "name", "tap nope: not found"},
		{"DELETE", "/v1/taps/nope", ``, 404, "name", "tap nope: not found"},
	}
	for _, tc := range cases {
		t.Run(tc.method+" "+tc.path+" "+tc.body, func(t *testing.T) {
			code, out := call(t, srv, tc.method, tc.path, tc.body)
			if code != tc.code {
				t.Fatalf("status %d, want %d (%v)", code, tc.code, out)
			}
			if out["field"] != tc.field {
				t.Errorf("field %v, want %s", out["field"], tc.field)
			}
			if msg, _ := out["error"].(string); !strings.Contains(msg, tc.msg) {
				t.Errorf("error %q, want it to contain %q", msg, tc.msg)
			}
		})
	}
	// Nothing refused was written.
	if out := mustCall(t, srv, "GET", "/v1/taps/one", ``, 200); out["sender"] != "blue/web/web1" || out["proto"] != 17.0 {
		t.Fatalf("one after refused changes: %v", out)
	}
}

func TestAPITapRefusedWhenEveryIDIsTakenAndTheViewSaysWhyARuleCopiesNothing(t *testing.T) {
	c, s, _, _ := tapServer(t)
	c.maxTaps = 2
	srv := newAPIServer(t, c)
	mustCall(t, srv, "POST", "/v1/taps", `{"name":"a","sender":"blue/web/web1","receiver":"any","monitor":"blue/ops/mon"}`, 201)
	mustCall(t, srv, "POST", "/v1/taps", `{"name":"b","sender":"red/app/app1","receiver":"any","monitor":"blue/ops/mon","crossFarm":true}`, 201)
	code, out := call(t, srv, "POST", "/v1/taps", `{"name":"c","sender":"blue/web/web2","receiver":"any","monitor":"blue/ops/mon"}`)
	if code != 409 || out["field"] != "name" || !strings.Contains(out["error"].(string), "there are 2 taps, as many as a host's datapath holds in both directions (2), 0 left") {
		t.Fatalf("third tap: %d %v", code, out)
	}
	// red withdraws its peering: b stays, but says it copies nothing.
	var red intent.Farm
	if err := store.GetJSON(t.Context(), s, intent.FarmsPrefix+"red", &red); err != nil {
		t.Fatal(err)
	}
	red.Peers = nil
	if err := store.PutJSON(t.Context(), s, intent.FarmsPrefix+"red", red); err != nil {
		t.Fatal(err)
	}
	if out := mustCall(t, srv, "GET", "/v1/taps/b", ``, 200); !strings.Contains(fmt.Sprint(out["problem"]), "do not peer") {
		t.Fatalf("b after red withdrew its peering: %v", out)
	}
}

// Two controllers on one store creating taps at once: every ID is taken
// by one policy only.
func TestConcurrentTapCreatesNeverShareAnID(t *testing.T) {
	a, s := newController()
	if err := a.ApplyTopology(t.Context(), parse(t, tapTopo)); err != nil {
		t.Fatal(err)
	}
	b := New(s, quietLog())
	senders := []string{"blue/web/web1", "blue/web/web2", "blue/db/db1", "blue/web", "blue/db", "any"}
	var wg sync.WaitGroup
	errs := make(chan error, 2*len(senders))
	for i, snd := range senders {
		for j, c := range []*Controller{a, b} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := c.CreateTap(t.Context(), intent.TapPolicy{Name: fmt.Sprintf("t%d-%d", i, j), Sender: snd, Receiver: "any",
					Monitor: "blue/ops/mon", TapFilter: intent.TapFilter{Proto: uint8(j + 1)}})
				errs <- err
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	all, _, err := store.ListJSON[intent.TapPolicy](t.Context(), s, intent.TapsPrefix)
	if err != nil {
		t.Fatal(err)
	}
	ids := map[uint32]string{}
	for _, p := range all {
		if other, dup := ids[p.ID]; dup {
			t.Fatalf("taps %s and %s share id %d", other, p.Name, p.ID)
		}
		ids[p.ID] = p.Name
	}
	if len(all) != 2*len(senders) {
		t.Fatalf("%d taps stored, want %d", len(all), 2*len(senders))
	}
}
