package ratelog

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func newTestLogger(burst int) (*Logger, *bytes.Buffer, *clock) {
	var buf bytes.Buffer
	c := &clock{t: time.Unix(1000, 0)}
	return New(slog.New(slog.NewTextHandler(&buf, nil)), burst, time.Second, c.now), &buf, c
}

func TestAFloodingKeyWritesAtMostItsBurstPerWindow(t *testing.T) {
	l, buf, _ := newTestLogger(3)
	for i := 0; i < 10000; i++ {
		l.Warn("dhcp/vif-a", "DHCP request not answered")
	}
	if n := strings.Count(buf.String(), "\n"); n != 3 {
		t.Fatalf("10000 lines in one window wrote %d lines, want 3:\n%s", n, buf.String())
	}
}

func TestTheNextWindowSaysHowManyWereSuppressed(t *testing.T) {
	l, buf, c := newTestLogger(1)
	for i := 0; i < 5; i++ {
		l.Warn("k", "x")
	}
	c.t = c.t.Add(time.Second)
	l.Warn("k", "x")
	if !strings.Contains(buf.String(), "suppressed=4") {
		t.Fatalf("second window's line does not count the 4 suppressed ones:\n%s", buf.String())
	}
}

func TestOneKeysFloodDoesNotSilenceAnother(t *testing.T) {
	l, buf, _ := newTestLogger(2)
	for i := 0; i < 1000; i++ {
		l.Warn("dhcp/vif-flooder", "flood")
	}
	l.Warn("dhcp/vif-victim", "victim line")
	if !strings.Contains(buf.String(), "victim line") {
		t.Fatalf("the victim's line was suppressed by another key's flood:\n%s", buf.String())
	}
}

func TestInventedKeysShareOneBudgetAndMemoryStaysBounded(t *testing.T) {
	l, buf, _ := newTestLogger(2)
	for i := 0; i < 3*MaxKeys; i++ {
		l.Warn(fmt.Sprintf("src/%d", i), "line")
	}
	if len(l.keys) > MaxKeys+1 {
		t.Fatalf("limiter holds %d keys, bound is %d", len(l.keys), MaxKeys+1)
	}
	if n := strings.Count(buf.String(), "\n"); n > MaxKeys+2 {
		t.Fatalf("%d invented keys wrote %d lines; beyond MaxKeys they must share one budget", 3*MaxKeys, n)
	}
}
