package main

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/controller"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/topology"
)

// tapController serves a controller with blue (web, db, ops) and red (app),
// peering both ways: web1 10.1.1.2, db1 10.1.2.2, mon 10.1.3.2, app1 10.2.1.2.
func tapController(t *testing.T) (string, *store.Memory) {
	t.Helper()
	topo, err := topology.Parse("t.yaml", []byte(`name: t
hosts: [{name: h1}, {name: h2}]
farms:
  - {name: blue, subnets: [{name: web}, {name: db}, {name: ops}], peers: [red]}
  - {name: red, subnets: [{name: app}], peers: [blue]}
vms:
  - {name: web1, host: h1, subnet: blue/web}
  - {name: db1, host: h2, subnet: blue/db}
  - {name: mon, host: h2, subnet: blue/ops}
  - {name: app1, host: h1, subnet: red/app}
`))
	if err != nil {
		t.Fatal(err)
	}
	s := store.NewMemory()
	c := controller.New(s, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err := c.ApplyTopology(t.Context(), topo); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(c.API())
	t.Cleanup(srv.Close)
	return srv.URL, s
}

func TestCLITapCreateListGetDelete(t *testing.T) {
	addr, s := tapController(t)
	steps := []cliStep{
		{[]string{"tap", "create", "web-http", "--sender", "blue/web/web1", "--receiver", "10.1.2.2", "--monitor", "blue/ops/mon", "--proto", "tcp", "--dport", "80"},
			"tap web-http: id 1, blue/web/web1 -> blue/db/db1, proto tcp dport 80, monitor blue/ops/mon\n", false},
		{[]string{"tap", "create", "all", "--sender", "blue/web", "--receiver", "any", "--monitor", "02:00:0a:01:03:02", "--both-directions"},
			"tap all: id 2, blue/web <-> any, all traffic, monitor blue/ops/mon\n", false},
		{[]string{"tap", "create", "red", "--sender", "red/app/app1", "--receiver", "any", "--monitor", "blue/ops/mon"},
			"monitor: the monitor is in farm blue and the sender in farm red", true},
		{[]string{"tap", "create", "red", "--sender", "red/app/app1", "--receiver", "any", "--monitor", "blue/ops/mon", "--proto", "udp", "--sport", "53", "--cross-farm"},
			"tap red: id 3, red/app/app1 -> any, proto udp sport 53, monitor blue/ops/mon (cross-farm)\n", false},
		{[]string{"tap", "create", "web-http", "--sender", "any", "--receiver", "any", "--monitor", "blue/ops/mon"},
			"name: tap web-http (id 1, blue/web/web1 -> blue/db/db1, monitor blue/ops/mon): already exists", true},
		{[]string{"tap", "create", "x", "--sender", "blue/web/nope", "--receiver", "any", "--monitor", "blue/ops/mon"}, "sender: no vm blue/web/nope", true},
		{[]string{"tap", "list"}, "TAP       ID  SENDER         RECEIVER     MONITOR       FILTER              DIRECTIONS\n" +
			"all       2   blue/web       any          blue/ops/mon  all traffic         both\n" +
			"red       3   red/app/app1   any          blue/ops/mon  proto udp sport 53  one\n" +
			"web-http  1   blue/web/web1  blue/db/db1  blue/ops/mon  proto tcp dport 80  one\n", false},
		{[]string{"tap", "get", "red"}, "tap red: id 3, red/app/app1 -> any, proto udp sport 53, monitor blue/ops/mon (cross-farm)\n", false},
		{[]string{"tap", "get", "nope"}, "name: tap nope: not found", true},
		{[]string{"get", "taps"}, "", false},
		{[]string{"tap", "delete", "web-http"}, "tap web-http deleted\n", false},
		{[]string{"tap", "delete", "web-http"}, "name: tap web-http: not found", true},
		{[]string{"tap", "create", "again", "--sender", "blue/db", "--receiver", "any", "--monitor", "blue/ops/mon"}, "tap again: id 1,", false},
	}
	runSteps(t, addr, steps)
	out, err := runOut("tap", "list", "-o", "json", "--api", addr)
	if err != nil {
		t.Fatal(err)
	}
	var list []controller.TapView
	if err := json.Unmarshal([]byte(out), &list); err != nil || len(list) != 3 || list[0].Name != "again" || list[0].ID != 1 || list[0].Sender != "blue/db" {
		t.Fatalf("list -o json: %v %+v\n%s", err, list, out)
	}
	stored, _, err := store.ListJSON[intent.TapPolicy](t.Context(), s, intent.TapsPrefix)
	if err != nil || len(stored) != 3 {
		t.Fatalf("stored %+v, %v", stored, err)
	}
}

// The CLI checks a policy with the controller's own checks and names the
// flag to change, before it contacts the controller (none listens here).
func TestCLITapChecksNameTheFlag(t *testing.T) {
	noAPI := []string{"--api", "http://127.0.0.1:1"}
	base := []string{"tap", "create", "t", "--sender", "any", "--receiver", "any", "--monitor", "blue/ops/mon"}
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"tap", "create", "t", "--receiver", "any", "--monitor", "blue/ops/mon"}, "--sender is required: who sends"},
		{[]string{"tap", "create", "t", "--sender", "any", "--monitor", "blue/ops/mon"}, "--receiver is required"},
		{[]string{"tap", "create", "t", "--sender", "any", "--receiver", "any"}, "--monitor is required: the VM the copies go to"},
		{[]string{"tap", "create", "T", "--sender", "any", "--receiver", "any", "--monitor", "blue/ops/mon"}, `NAME: tap name "T" must be`},
		{[]string{"tap", "create", "t", "--sender", "blue", "--receiver", "any", "--monitor", "blue/ops/mon"}, `--sender: "blue": want farm/subnet/vm`},
		{[]string{"tap", "create", "t", "--sender", "any", "--receiver", "any", "--monitor", "any"}, `--monitor: "any" is not one VM`},
		{append(base, "--proto", "sctp"), `--proto: protocol "sctp": want tcp, udp, icmp, any or an IP protocol number 0-255`},
		{append(base, "--sport", "0"), `--sport: ports "0": port 0 is not a port`},
		{append(base, "--dport", "90-80"), `--dport: ports "90-80": the range ends below its start`},
		{append(base, "--proto", "icmp", "--dport", "80"), "--dport: a dport filter needs proto tcp, udp or any, not icmp"},
		{append(base, "--vlan", "x"), `--vlan: "x": want a segment number 1-65535`},
		{append(base, "--vlan", "512"), "--vlan: vlan 512 is not a segment"},
		{[]string{"tap", "get", "Bad"}, `NAME: tap name "Bad"`},
		{[]string{"tap", "delete", "Bad"}, `NAME: tap name "Bad"`},
		{[]string{"tap", "list", "-o", "yaml"}, `invalid argument "yaml" for "-o, --output" flag: want text or json`},
	}
	for _, tc := range cases {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			err := run(append(tc.args, noAPI...)...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestTapHelpTeachesCopiesDirectionAndExamples(t *testing.T) {
	for _, args := range [][]string{{"tap", "--help"}, {"tap", "create", "--help"}} {
		out, err := runOut(args...)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"a copy of it", "One direction", "--both-directions", "onehop tap create web-http --sender blue/web/web1", "farm id * 256 + subnet id", "--cross-farm"} {
			if !strings.Contains(out, want) {
				t.Errorf("%v: no %q in\n%s", args, want, out)
			}
		}
	}
}

func TestStatsShowsEachTapRulesCopies(t *testing.T) {
	var out bytes.Buffer
	printAgentStatus(&out, intent.AgentStatus{Node: "h1", Time: time.Unix(0, 0), Taps: []intent.TapStats{
		{Policy: "web", ID: 2 | intent.TapReverse, Packets: 3, Bytes: 300},
		{Policy: "web", ID: 2, Packets: 10, Bytes: 1000, Dropped: 1},
		{Policy: "all", ID: 1, Packets: 0},
	}})
	want := "  tap all                  copies 0 packets 0 bytes, dropped 0\n" +
		"  tap web                  copies 10 packets 1000 bytes, dropped 1\n" +
		"  tap web (reverse)        copies 3 packets 300 bytes, dropped 0\n"
	if !strings.HasSuffix(out.String(), want) {
		t.Fatalf("stats:\n%s\nwant it to end with\n%s", out.String(), want)
	}
}
