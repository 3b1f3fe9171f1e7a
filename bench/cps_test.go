package main

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/testenv"
)

// rrperf's cps against its close-first server on loopback: every
// connection ends with the server's close and is counted; against a port
// nobody serves, each refusal is counted and the test goes on to its end,
// and ParseCPS keeps the failures beside the rate.
func TestRRPerfCPSCountsCompletedAndRefusedConnections(t *testing.T) {
	free := func() string {
		l, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		return l.Addr().String()
	}
	addr := free()
	go rrServe(addr, -1, true) //nolint:errcheck // ends with the test binary
	testenv.Eventually(t, "the server to listen on "+addr, 5*time.Second, func() error {
		c, err := net.Dial("tcp4", addr)
		if err == nil {
			c.Close()
		}
		return err
	})
	r := rrClient("cps", addr, 200*time.Millisecond)
	if r.Errors != 0 || r.Count == 0 {
		t.Fatalf("cps against the close-first server: %+v, want connections and no error", r)
	}

	r = rrClient("cps", free(), 200*time.Millisecond)
	if r.Count != 0 || r.Errors < 2 || !strings.Contains(r.Err, "refused") {
		t.Fatalf("cps against a port nobody serves: %+v, want every attempt refused and counted, more than one", r)
	}
	if _, err := ParseCPS([]byte(`{"mode":"cps","count":0,"seconds":3,"errors":7,"err":"connect: connection refused"}`)); err == nil || !strings.Contains(err.Error(), "7 failed") {
		t.Errorf("a cps run that completed nothing: %v, want an error naming the 7 failures", err)
	}
	m, err := ParseCPS([]byte(`{"mode":"cps","count":3000,"seconds":3,"errors":12,"err":"i/o timeout"}`))
	if err != nil || m.Value != 1000 || m.Extra["failed"] != 12 {
		t.Errorf("a cps run with some failures: %+v %v, want 1000/s and 12 failed", m, err)
	}
}
