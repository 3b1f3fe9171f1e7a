package controller

import (
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/desired"
	"github.com/onehop/onehop/internal/intent"
)

// A controller that died mid-capture left its record: the next one to
// start removes it, and the hosts' desired state loses the capture's
// rules, so they stop copying to an address no one reads.
func TestControllerStartRemovesTheCaptureRecordsOfADeadController(t *testing.T) {
	c, s := newController()
	file := tapTopo + "taps:\n  - {name: web, sender: blue/web/web1, receiver: any, monitor: blue/ops/mon}\n"
	if err := c.ApplyTopology(t.Context(), parse(t, file)); err != nil {
		t.Fatal(err)
	}
	if err := c.startCapture(t.Context(), "web", netip.MustParseAddr("192.168.100.1")); err != nil {
		t.Fatal(err)
	}
	rules := func(c *Controller) string {
		t.Helper()
		if _, err := c.CompileOnce(t.Context()); err != nil {
			t.Fatal(err)
		}
		d, _, err := desired.Read(t.Context(), s, "h1")
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, r := range d.Taps {
			out = append(out, fmt.Sprintf("%s#%d>%s%s", r.Policy, r.ID, r.MonitorHost, r.Collector))
		}
		return strings.Join(out, " ")
	}
	capID := fmt.Sprint(1 | intent.TapCapture)
	if got, want := rules(c), "web#1>h3 web#"+capID+">192.168.100.1"; got != want {
		t.Fatalf("h1's rules while capturing: %q, want %q", got, want)
	}

	// The controller dies (the request with it, stopCapture never runs);
	// a new one starts on the same store. A record that does not decode
	// (it would stop every full compile) goes as well.
	if err := s.Put(t.Context(), intent.TapCapturesPrefix+"old", []byte("{")); err != nil {
		t.Fatal(err)
	}
	again := New(s, slog.New(slog.NewTextHandler(io.Discard, nil)))
	gone, err := again.ClearCaptures(t.Context())
	if err != nil || strings.Join(gone, " ") != "old web" {
		t.Fatalf("ClearCaptures: %v %v, want old and web", gone, err)
	}
	if kvs, _, err := s.List(t.Context(), intent.TapCapturesPrefix); err != nil || len(kvs) != 0 {
		t.Fatalf("capture records left: %v %v", kvs, err)
	}
	if got := rules(again); got != "web#1>h3" {
		t.Fatalf("h1's rules after the restart: %q, want the policy's own only", got)
	}
	// The policy is not touched, and can be captured again (no 409).
	if _, err := again.getTap(t.Context(), "web"); err != nil {
		t.Fatal(err)
	}
	if err := again.startCapture(t.Context(), "web", netip.MustParseAddr("192.168.100.1")); err != nil {
		t.Fatalf("a capture after the restart: %v", err)
	}
	again.stopCapture("web")
	if gone, err := again.ClearCaptures(t.Context()); err != nil || len(gone) != 0 {
		t.Fatalf("ClearCaptures with no record: %v %v", gone, err)
	}
}
