package main

import (
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/agent"
)

func TestAgentUplinkFlagTakesRepeatsAndRefusesBadNames(t *testing.T) {
	var cfg agent.Config
	if err := setUplinks(&cfg, []string{"uplink0", "uplink1"}); err != nil {
		t.Fatal(err)
	}
	if cfg.Uplink != "uplink0" || len(cfg.MoreUplinks) != 1 || cfg.MoreUplinks[0] != "uplink1" {
		t.Fatalf("uplinks = %q + %q, want uplink0 + [uplink1]", cfg.Uplink, cfg.MoreUplinks)
	}
	for _, c := range []struct {
		names []string
		want  string
	}{
		{nil, "at least one"},
		{[]string{"a", "a"}, `"a": given twice`},
		{[]string{"a", "b", "c", "d", "e"}, "at most 4"},
		{[]string{"averyveryverylongname"}, "not an interface name"},
		{[]string{"a/b"}, "not an interface name"},
		{[]string{""}, "not an interface name"},
	} {
		err := setUplinks(&cfg, c.names)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("setUplinks(%q) = %v, want an error containing %q", c.names, err, c.want)
		}
	}
}
