package controller

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/accept"
	"github.com/onehop/onehop/internal/accept/accepttest"
	"github.com/onehop/onehop/internal/testenv"
)

// TestLocationServerRefusalsShowInMetrics: the location server's streams
// over a source's cap are closed at once, and /metrics counts them under
// listener="location"; the source's stream within the cap is served
// (control first), and another source still gets in.
func TestLocationServerRefusalsShowInMetrics(t *testing.T) {
	c, _ := newController()
	addr, err := c.serveLocations(t.Context(), "127.0.0.1:0", accept.Limits{PerSource: 2}, nil, c.log)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(c.API())
	defer srv.Close()
	sample := `onehop_listener_refused_total{listener="location",reason="per_source"}`
	if got := metric(t, srv.URL, sample); got != "0" {
		t.Fatalf("%s = %s before any stream, want 0", sample, got)
	}
	for range 2 {
		accepttest.DialFrom(t, addr, "127.0.0.1")
	}
	testenv.Eventually(t, "two streams open", 10*time.Second, func() bool {
		return metric(t, srv.URL, `onehop_listener_open_connections{listener="location"}`) == "2"
	})
	over := accepttest.DialFrom(t, addr, "127.0.0.1")
	over.SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := over.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Fatalf("a third stream from one source: read %d, %v; want it closed", n, err)
	}
	if got := metric(t, srv.URL, sample); got != "1" {
		t.Fatalf("%s = %s, want 1", sample, got)
	}
	accepttest.DialFrom(t, addr, "127.0.0.2")
	testenv.Eventually(t, "another source's stream open", 10*time.Second, func() bool {
		return metric(t, srv.URL, `onehop_listener_open_connections{listener="location"}`) == "3"
	})
}
