package controller

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/onehop/onehop/internal/desired"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
)

// putNode records what host's agent reports: its uplinks (index 0 first,
// each with an address) and its ephemeral range (0/0: not reported).
func putNode(t *testing.T, s store.Store, host string, uplinks int, ephLo, ephHi uint16) {
	t.Helper()
	n := intent.Node{Name: host, Uplink: "uplink0", UplinkIP: "192.168.100.10", EphemeralLo: ephLo, EphemeralHi: ephHi}
	for k := 0; k < uplinks; k++ {
		n.Uplinks = append(n.Uplinks, intent.NodeUplink{Index: k, Name: fmt.Sprintf("uplink%d", k), IP: fmt.Sprintf("192.168.100.%d", 10+k), Bits: 24})
	}
	if err := store.PutJSON(t.Context(), s, intent.NodesPrefix+host, n); err != nil {
		t.Fatal(err)
	}
}

func TestAPICreatesSliversWithLowestFreeSlotsKeptAcrossChanges(t *testing.T) {
	srv, s := apiServer(t)
	putHost(t, s, "h2")
	putNode(t, s, "h1", 2, 0, 0)
	out := mustCall(t, srv, "POST", "/v1/slivers", `{"host":"h1","name":"s1","ports":"10000-10099"}`, 201)
	if out["slot"] != 1.0 || out["ports"] != "10000-10099" || out["host"] != "h1" || out["name"] != "s1" {
		t.Fatalf("s1: %v", out)
	}
	if lease := out["leases"].([]any)[0].(map[string]any); lease["uplink"] != 0.0 || lease["lo"] != 10000.0 || lease["hi"] != 10099.0 {
		t.Fatalf("s1 leases: %v", out["leases"])
	}
	out = mustCall(t, srv, "POST", "/v1/slivers", `{"host":"h1","name":"s2","ports":"1:20000-20099,10100-10199"}`, 201)
	if out["slot"] != 2.0 || out["ports"] != "10100-10199,1:20000-20099" {
		t.Fatalf("s2: %v", out)
	}
	mustCall(t, srv, "POST", "/v1/slivers", `{"host":"h1","name":"s3","ports":"10200"}`, 201)
	// Slots are per host: h2 starts at 1, and may lease what h1's slivers do.
	if out = mustCall(t, srv, "POST", "/v1/slivers", `{"host":"h2","name":"s1","ports":"10000-10099"}`, 201); out["slot"] != 1.0 {
		t.Fatalf("h2/s1: %v", out)
	}
	// A PUT keeps the slot; a delete frees it, and the next sliver takes
	// the lowest free one, not the next after the highest.
	if out = mustCall(t, srv, "PUT", "/v1/slivers/h1/s2", `{"ports":"10100-10149"}`, 200); out["slot"] != 2.0 || out["ports"] != "10100-10149" {
		t.Fatalf("put s2: %v", out)
	}
	mustCall(t, srv, "DELETE", "/v1/slivers/h1/s1", ``, 204)
	if out = mustCall(t, srv, "POST", "/v1/slivers", `{"host":"h1","name":"s4","ports":"10000-10010"}`, 201); out["slot"] != 1.0 {
		t.Fatalf("s4 after s1 left: %v, want slot 1", out)
	}
	if out = mustCall(t, srv, "GET", "/v1/slivers/h1/s2", ``, 200); out["slot"] != 2.0 || out["ports"] != "10100-10149" {
		t.Fatalf("get s2: %v", out)
	}

	list := func(q string) []SliverView {
		resp, err := http.Get(srv.URL + "/v1/slivers" + q)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out []SliverView
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != 200 {
			t.Fatalf("list%s: %d %v", q, resp.StatusCode, err)
		}
		return out
	}
	var got []string
	for _, v := range list("") {
		got = append(got, fmt.Sprintf("%s#%d=%s", v.FullName(), v.Slot, v.Ports))
	}
	want := "h1/s4#1=10000-10010 h1/s2#2=10100-10149 h1/s3#3=10200 h2/s1#1=10000-10099"
	if strings.Join(got, " ") != want {
		t.Fatalf("list: %v, want %s", got, want)
	}
	if only := list("?host=h2"); len(only) != 1 || only[0].FullName() != "h2/s1" {
		t.Fatalf("list ?host=h2: %+v", only)
	}

	// The host's desired state carries its slivers, by slot.
	c := New(s, quietLog())
	if _, err := c.CompileOnce(t.Context()); err != nil {
		t.Fatal(err)
	}
	d, _, err := desired.Read(t.Context(), s, "h1")
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Slivers) != 3 || d.Slivers[0].Name != "s4" || d.Slivers[1].Name != "s2" || d.Slivers[2].Name != "s3" {
		t.Fatalf("h1 desired slivers: %+v", d.Slivers)
	}
}

func TestAPISliverErrorsNameTheFieldAndTheOtherHolder(t *testing.T) {
	srv, s := apiServer(t)
	putHost(t, s, "h2")
	putNode(t, s, "h1", 2, 40000, 45000) // h1 reports two uplinks and its own ephemeral range
	// h2's agent has not reported: uplink 0 only, Linux's default range.
	mustCall(t, srv, "POST", "/v1/slivers", `{"host":"h1","name":"s1","ports":"10000-10099,1:20000-20099"}`, 201)
	mustCall(t, srv, "POST", "/v1/slivers", `{"host":"h1","name":"s2","ports":"10100-10199"}`, 201)
	cases := []struct {
		method, path, body string
		code               int
		field, msg         string
	}{
		{"POST", "/v1/slivers", `{"host":"h9","name":"s3","ports":"10200"}`, 400, "host", `no host "h9"`},
		{"POST", "/v1/slivers", `{"host":"h1","name":"S3","ports":"10200"}`, 400, "name", "1-12 lowercase letters or digits"},
		{"POST", "/v1/slivers", `{"host":"h1","name":"averylongname","ports":"10200"}`, 400, "name", "1-12 lowercase"},
		{"POST", "/v1/slivers", `{"host":"h1","name":"s3","ports":""}`, 400, "ports", "empty lease list"},
		{"POST", "/v1/slivers", `{"host":"h1","name":"s3","ports":"0-10"}`, 400, "ports", `port "0"`},
		{"POST", "/v1/slivers", `{"host":"h1","name":"s3","ports":"200-100"}`, 400, "ports", "runs backwards"},
		{"POST", "/v1/slivers", `{"host":"h1","name":"s3","ports":"10200-10299,10250"}`, 400, "ports", "overlap on ports 10250"},
		{"POST", "/v1/slivers", `{"host":"h1","name":"s3","ports":"2:10200"}`, 400, "ports", "lease 2:10200 is on uplink 2, but host h1 has uplinks 0, 1 only"},
		{"POST", "/v1/slivers", `{"host":"h2","name":"s3","ports":"1:10200"}`, 400, "ports", "host h2 has uplinks 0 only"},
		{"POST", "/v1/slivers", `{"host":"h1","name":"s3","ports":"10","port":"x"}`, 400, "port", "unknown field"},
		{"POST", "/v1/slivers", `{"host":"h1","name":"s1","ports":"10200"}`, 409, "name", "sliver h1/s1 (slot 1, ports 10000-10099,1:20000-20099): already exists"},
		{"POST", "/v1/slivers", `{"host":"h1","name":"s3","ports":"10050-10149"}`, 409, "ports", "ports 10050-10099 on uplink 0 overlap h1/s1's lease 10000-10099"},
		{"POST", "/v1/slivers", `{"host":"h1","name":"s3","ports":"1:20099"}`, 409, "ports", "ports 20099 on uplink 1 overlap h1/s1's lease 20000-20099"},
		{"POST", "/v1/slivers", `{"host":"h1","name":"s3","ports":"44000-46000"}`, 409, "ports", "ports 44000-45000 on uplink 0 overlap host h1's ephemeral range 40000-45000"},
		{"POST", "/v1/slivers", `{"host":"h2","name":"s3","ports":"32000-33000"}`, 409, "ports", "ports 32768-33000 on uplink 0 overlap host h2's ephemeral range 32768-60999"},
		{"PUT", "/v1/slivers/h1/s2", `{"ports":"10099-10199"}`, 409, "ports", "ports 10099 on uplink 0 overlap h1/s1's lease 10000-10099"},
		{"PUT", "/v1/slivers/h1/s2", `{"ports":"x"}`, 400, "ports", `port "x"`},
		{"PUT", "/v1/slivers/h1/nope", `{"ports":"10300"}`, 404, "sliver", "sliver h1/nope: not found"},
		{"PUT", "/v1/slivers/h9/s1", `{"ports":"10300"}`, 404, "sliver", "sliver h9/s1: not found"},
		{"GET", "/v1/slivers/h1/nope", ``, 404, "sliver", "sliver h1/nope: not found"},
		{"DELETE", "/v1/slivers/h1/nope", ``, 404, "sliver", "sliver h1/nope: not found"},
		{"GET", "/v1/slivers?host=h9", ``, 400, "host", `no host "h9"`},
	}
	for _, c := range cases {
		t.Run(c.method+" "+c.path+" "+c.body, func(t *testing.T) {
			code, out := call(t, srv, c.method, c.path, c.body)
			if code != c.code {
				t.Fatalf("status %d, want %d (%v)", code, c.code, out)
			}
			if out["field"] != c.field {
				t.Errorf("field %v, want %s", out["field"], c.field)
			}
			if msg, _ := out["error"].(string); !strings.Contains(msg, c.msg) {
				t.Errorf("error %q, want it to contain %q", msg, c.msg)
			}
		})
	}
	// Nothing refused was written: s2 still holds its own range.
	if out := mustCall(t, srv, "GET", "/v1/slivers/h1/s2", ``, 200); out["ports"] != "10100-10199" {
		t.Fatalf("s2 after refused changes: %v", out)
	}
	// s2 may grow into free ports; the overlap check skips its own lease.
	mustCall(t, srv, "PUT", "/v1/slivers/h1/s2", `{"ports":"10100-10299"}`, 200)
}

func TestAPIRefusesASliverOnAFullHostNamingIt(t *testing.T) {
	c, s := newController()
	c.maxSlivers = 3
	putHost(t, s, "h1")
	srv := newAPIServer(t, c)
	for i := 1; i <= 3; i++ {
		mustCall(t, srv, "POST", "/v1/slivers", fmt.Sprintf(`{"host":"h1","name":"s%d","ports":"%d"}`, i, 10000+i), 201)
	}
	code, out := call(t, srv, "POST", "/v1/slivers", `{"host":"h1","name":"s4","ports":"10004"}`)
	if code != 409 || out["field"] != "host" || !strings.Contains(out["error"].(string), `host "h1" holds 3 slivers, as many as its datapath holds (3), 0 left`) {
		t.Fatalf("4th sliver: %d %v", code, out)
	}
	mustCall(t, srv, "DELETE", "/v1/slivers/h1/s2", ``, 204)
	if out := mustCall(t, srv, "POST", "/v1/slivers", `{"host":"h1","name":"s4","ports":"10004"}`, 201); out["slot"] != 2.0 {
		t.Fatalf("s4 after s2 left: %v", out)
	}
}

// Two controllers on one store (each with its own lock, as two
// controller processes on one etcd) creating slivers at once: every range
// and every slot is taken by one of them only.
func TestConcurrentSliverCreatesNeverShareARangeOrASlot(t *testing.T) {
	_, s := newController()
	putHost(t, s, "h1")
	testConcurrentCreates(t, s)
}

func testConcurrentCreates(t *testing.T, s store.Store) {
	t.Helper()
	a, b := New(s, quietLog()), New(s, quietLog())
	const n = 20
	type result struct {
		name string
		s    intent.Sliver
		err  error
	}
	results := make(chan result, 2*n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		for j, c := range []*Controller{a, b} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Both controllers try the same range under two names, and
				// each name under two ranges: one of each pair must lose.
				name := fmt.Sprintf("s%d%c", i, 'a'+j)
				sl, err := c.CreateSliver(context.Background(), "h1", name, fmt.Sprintf("%d-%d", 10000+10*i, 10009+10*i))
				results <- result{name, sl, err}
			}()
		}
	}
	wg.Wait()
	close(results)
	won := 0
	for r := range results {
		if r.err == nil {
			won++
			continue
		}
		if !strings.Contains(r.err.Error(), "overlap") && !strings.Contains(r.err.Error(), "kept changing") {
			t.Errorf("%s: %v", r.name, r.err)
		}
	}
	stored, _, err := store.ListJSON[intent.Sliver](context.Background(), s, intent.SliversPrefix)
	if err != nil {
		t.Fatal(err)
	}
	if len(stored) != won {
		t.Fatalf("%d creates succeeded, %d slivers stored", won, len(stored))
	}
	if won == 0 {
		t.Fatal("no create succeeded")
	}
	slots, ports := map[uint32]string{}, map[uint16]string{}
	for _, sl := range stored {
		if other, dup := slots[sl.Slot]; dup {
			t.Errorf("slot %d held by %s and %s", sl.Slot, other, sl.Name)
		}
		slots[sl.Slot] = sl.Name
		for _, l := range sl.Leases {
			for p := uint32(l.Lo); p <= uint32(l.Hi); p++ {
				if other, dup := ports[uint16(p)]; dup {
					t.Fatalf("port %d leased by %s and %s", p, other, sl.Name)
				}
				ports[uint16(p)] = sl.Name
			}
		}
	}
}

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// newAPIServer serves c's API until the test ends.
func newAPIServer(t *testing.T, c *Controller) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(c.API())
	t.Cleanup(srv.Close)
	return srv
}

// The same race on a real etcd: PutIfUnchanged is one etcd transaction
// comparing every sliver key of the host with the revision read.
func TestConcurrentSliverCreatesOnEtcdNeverShareARangeOrASlot(t *testing.T) {
	s := embeddedStore(t, EtcdOptions{})
	if err := store.PutJSON(t.Context(), s, intent.HostsPrefix+"h1", intent.Host{Name: "h1"}); err != nil {
		t.Fatal(err)
	}
	// A stale revision is refused, a current one taken, a deletion after
	// it does not count.
	_, rev, err := s.List(t.Context(), intent.SliversPrefix+"h1/")
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := s.PutIfUnchanged(t.Context(), intent.SliversPrefix+"h1/", rev, intent.SliversPrefix+"h1/x", []byte("{}")); !ok || err != nil {
		t.Fatalf("put at the current revision: %v %v", ok, err)
	}
	if ok, err := s.PutIfUnchanged(t.Context(), intent.SliversPrefix+"h1/", rev, intent.SliversPrefix+"h1/y", []byte("{}")); ok || err != nil {
		t.Fatalf("put at a stale revision: wrote %v (%v)", ok, err)
	}
	if ok, err := s.PutIfUnchanged(t.Context(), intent.SliversPrefix+"h2/", rev, intent.SliversPrefix+"h2/y", []byte("{}")); !ok || err != nil {
		t.Fatalf("another host's prefix, unchanged: %v %v", ok, err)
	}
	_, rev, _ = s.List(t.Context(), intent.SliversPrefix+"h1/")
	if err := s.Delete(t.Context(), intent.SliversPrefix+"h1/x"); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.PutIfUnchanged(t.Context(), intent.SliversPrefix+"h1/", rev, intent.SliversPrefix+"h1/z", []byte("{}")); !ok || err != nil {
		t.Fatalf("after a deletion: %v %v", ok, err)
	}
	for _, k := range []string{"h1/z", "h2/y"} {
		if err := s.Delete(t.Context(), intent.SliversPrefix+k); err != nil {
			t.Fatal(err)
		}
	}
	testConcurrentCreates(t, s)
}

// The in-memory store's PutIfUnchanged answers as etcd's does.
func TestMemoryPutIfUnchangedAnswersAsEtcd(t *testing.T) {
	s := store.NewMemory()
	ctx := t.Context()
	_, rev, _ := s.List(ctx, "/a/")
	if ok, _ := s.PutIfUnchanged(ctx, "/a/", rev, "/a/x", nil); !ok {
		t.Fatal("put at the current revision refused")
	}
	if ok, _ := s.PutIfUnchanged(ctx, "/a/", rev, "/a/y", nil); ok {
		t.Fatal("put at a stale revision taken")
	}
	if ok, _ := s.PutIfUnchanged(ctx, "/b/", rev, "/b/y", nil); !ok {
		t.Fatal("another prefix, unchanged: refused")
	}
	_, rev, _ = s.List(ctx, "/a/")
	s.Delete(ctx, "/a/x")
	if ok, _ := s.PutIfUnchanged(ctx, "/a/", rev, "/a/z", nil); !ok {
		t.Fatal("a deletion after the revision refused the put")
	}
}
