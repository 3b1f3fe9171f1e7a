package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/controller"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
)

// `onehop status` shows the size against the quota and says NOSPACE in
// words: a store refusing writes must not look like a healthy one.
func TestStatusShowsTheQuotaAndANoSpaceAlarm(t *testing.T) {
	st := controller.StoreStatus{Health: store.Health{DBSize: 3 << 20, DBSizeInUse: 1 << 20, Quota: 4 << 20, Revision: 42,
		Alarms: []string{"NOSPACE (member 1)"}}, NoSpace: true}
	var out bytes.Buffer
	printStoreStatus(&out, st, []intent.AgentStatus{{Node: "h1"}, {Node: "h2", Error: "x"}})
	for _, want := range []string{"3.0 MiB (1.0 MiB in use) of a 4.0 MiB quota (75.0%)", "NOSPACE: etcd refuses every write", "2 reporting, 1 with an error"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("status output lacks %q:\n%s", want, out.String())
		}
	}
}
