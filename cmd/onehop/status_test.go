package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/controller"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/version"
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

// A rolling upgrade half done: `onehop status` names each host whose agent
// runs another release, commit or datapath than the controller, and says
// how; a host running the controller's is not named.
func TestStatusFlagsHostsWhoseAgentRunsAnotherVersion(t *testing.T) {
	ctl := version.Info{Version: "v1.2.0", Commit: "aaaa", Go: "go1.26.8", BPF: "b1"}
	newer := version.Info{Version: "v1.3.0", Commit: "bbbb", Go: "go1.26.8", BPF: "b2"}
	same := ctl
	same.Date = "another build date"
	var r statusReport
	r.fill(ctl, []intent.AgentStatus{{Node: "h3", Version: &newer}, {Node: "h1", Version: &same}, {Node: "h2"}})
	var out bytes.Buffer
	printVersions(&out, r)
	for _, want := range []string{
		"controller onehop v1.2.0 (commit aaaa",
		"2 of 3 agents run another version than the controller",
		"h2           reports no version",
		"h3           version v1.3.0, not v1.2.0; commit bbbb, not aaaa; bpf b2, not b1",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "h1 ") {
		t.Errorf("h1 runs the controller's version but is named:\n%s", out.String())
	}
	var got statusReport
	out.Reset()
	if err := printJSON(&out, r); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.OtherVersions) != 2 || got.OtherVersions[1].Node != "h3" || got.OtherVersions[1].Version.BPF != "b2" || got.Controller != ctl {
		t.Errorf("-o json: %+v", got)
	}
}
