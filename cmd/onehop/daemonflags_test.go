package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

var daemons = [][]string{{"controller"}, {"agent"}, {"gateway", "run"}, {"xtr", "run"}, {"vnat", "run"}}

// Every daemon takes --log-format, --log-level and --metrics-addr the same
// way, and refuses a bad value naming the flag before it starts anything.
func TestEveryDaemonRefusesABadLogFormatOrLevelNamingTheFlag(t *testing.T) {
	for _, d := range daemons {
		for _, tc := range []struct{ flag, value, want string }{
			{"--log-format", "xml", `invalid argument "xml" for "--log-format" flag: want text or json`},
			{"--log-level", "loud", `invalid argument "loud" for "--log-level" flag: want debug, info, warn or error`},
		} {
			args := append(append([]string{}, d...), tc.flag, tc.value)
			if err := run(args...); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("onehop %s: %v, want %q", strings.Join(args, " "), err, tc.want)
			}
		}
		c, _, err := newRootCmd().Find(d)
		if err != nil {
			t.Fatal(err)
		}
		if c.Flags().Lookup("metrics-addr") == nil {
			t.Errorf("onehop %s has no --metrics-addr", strings.Join(d, " "))
		}
	}
}

func TestJSONLogsAreOneObjectALineAtTheLevelAsked(t *testing.T) {
	var l logFlags
	if err := l.format.Set("json"); err != nil {
		t.Fatal(err)
	}
	if err := l.level.Set("warn"); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	log := l.to(&out)
	log.Info("not written")
	log.Warn("path down", "path", "wan1")
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 1 {
		t.Fatalf("at warn: %d lines, want the warning only:\n%s", len(lines), out.String())
	}
	var rec map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &rec); err != nil {
		t.Fatalf("not JSON: %q: %v", lines[0], err)
	}
	if rec["level"] != "WARN" || rec["msg"] != "path down" || rec["path"] != "wan1" {
		t.Fatalf("record %v", rec)
	}
}
