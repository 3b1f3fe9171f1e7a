package controller

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"

	"github.com/onehop/onehop/internal/topology"
)

// fuzzController is a controller with the fuzz topology, made once per
// target: the targets below only read the intent.
func fuzzController(f *testing.F) *Controller {
	topo, err := topology.Parse("fuzz.yaml", []byte(fuzzTopo))
	if err != nil {
		f.Fatal(err)
	}
	c, _ := newController()
	if err := c.ApplyTopology(f.Context(), topo); err != nil {
		f.Fatal(err)
	}
	return c
}

// replied fails t unless err is what reply makes a 2xx of, or a 4xx
// naming its field (never a 500).
func replied(t *testing.T, what string, err error) {
	t.Helper()
	rec := httptest.NewRecorder()
	reply(rec, http.StatusOK, struct{}{}, err)
	if rec.Code >= 500 || rec.Code >= 400 && !hasField(err) {
		t.Fatalf("%s: %d %s", what, rec.Code, rec.Body)
	}
}

func hasField(err error) bool {
	fe, ok := err.(*FieldError)
	return ok && fe.Field != "" && fe.Msg != ""
}

// GET /v1/trace's query, up to asking the hosts (which the fuzz topology
// has none of): its parameters read, FROM and TO resolved and authorized,
// as an administrator and as a tenant. 200 or a 4xx naming the field.
func FuzzAPITraceQuery(f *testing.F) {
	for _, s := range [][7]string{
		{"blue/web/web1", "blue/web/web2", "tcp", "40000", "80", "S", ""},
		{"blue/web/web1", "10.1.1.255", "udp", "", "53", "", ""},
		{"blue/web/web1", "blue/web/web2", "icmp", "1", "", "", ""},
		{"h1/s1", "192.0.2.7", "udp", "10001", "53", "", ""},
		{"192.0.2.7", "h1/s1", "tcp", "443", "10001", "A", ""},
		{"203.0.113.9", "blue/web/web1", "", "", "9", "", "10.1.1.99"},
		{"blue/web", "x/y/z/w", "sctp", "0", "65536", "Q", "::1"},
		{"", "", "", "-1", "x", "", "1.2.3"},
		{"224.0.0.1", "255.255.255.255", "TCP", "1", "1", "fsrpau", ""},
	} {
		f.Add(s[0], s[1], s[2], s[3], s[4], s[5], s[6])
	}
	c := fuzzController(f)
	tenant := WithIdentity(context.Background(), Identity{Farm: "blue", Via: "tenant-token"})
	f.Fuzz(func(t *testing.T, from, to, proto, sport, dport, flags, srcIP string) {
		q := url.Values{"from": {from}, "to": {to}, "proto": {proto}, "sport": {sport}, "dport": {dport}, "flags": {flags}, "src-ip": {srcIP}}
		req, err := traceQuery(q)
		if err != nil {
			replied(t, "trace query "+q.Encode(), err)
			return
		}
		for _, ctx := range []context.Context{t.Context(), tenant} {
			_, _, err := c.resolveTrace(ctx, req)
			replied(t, "trace "+q.Encode(), err)
		}
	})
}

// GET /v1/observe's filter (farm, vm, node, reason), as an administrator
// and as a tenant: 200 or a 4xx naming the field.
func FuzzAPIObserveQuery(f *testing.F) {
	for _, s := range [][4]string{
		{"blue", "", "", ""}, {"", "blue/web/web1", "h1", "spoofed_ip"}, {"red", "blue/web/web1", "", ""},
		{"", "blue/web", "", ""}, {"", "a/b/c", "nohost", ""}, {"blue", "blue/web/web1/x", "h1", "x"}, {"", "", "", ""},
	} {
		f.Add(s[0], s[1], s[2], s[3])
	}
	c := fuzzController(f)
	tenant := WithIdentity(context.Background(), Identity{Farm: "blue", Via: "tenant-token"})
	f.Fuzz(func(t *testing.T, farm, vm, node, reason string) {
		for _, ctx := range []context.Context{t.Context(), tenant} {
			_, err := c.observeFilter(ctx, farm, vm, node, reason)
			replied(t, "observe farm="+farm+" vm="+vm+" node="+node, err)
		}
	})
}
