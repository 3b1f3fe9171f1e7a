package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/lab"
	"github.com/onehop/onehop/internal/store"
)

// runOut executes the CLI in-process and returns what it printed.
func runOut(args ...string) (string, error) {
	cmd := newRootCmd()
	var out bytes.Buffer
	cmd.SetArgs(args)
	cmd.SetOut(&out)
	cmd.SetErr(&bytes.Buffer{})
	err := cmd.Execute()
	return out.String(), err
}

func TestCLISliverCreateSetListDelete(t *testing.T) {
	addr, s := testController(t)
	steps := []cliStep{
		{[]string{"sliver", "create", "h1/s1", "--ports", "10000-10099"}, "sliver h1/s1: slot 1, ports 10000-10099\n", false},
		{[]string{"sliver", "create", "h1/s2", "--ports", "10150,10100-10149"}, "sliver h1/s2: slot 2, ports 10100-10149,10150\n", false},
		{[]string{"sliver", "create", "h1/s3", "--ports", "10050-10120"}, "ports: ports 10050-10099 on uplink 0 overlap h1/s1's lease 10000-10099", true},
		{[]string{"sliver", "create", "h1/s3", "--ports", "33000"}, "ports: ports 33000 on uplink 0 overlap host h1's ephemeral range 32768-60999", true},
		{[]string{"sliver", "create", "h1/s3", "--ports", "1:10300"}, "ports: lease 1:10300 is on uplink 1, but host h1 has uplinks 0 only", true},
		{[]string{"sliver", "create", "h1/s1", "--ports", "10400"}, "name: sliver h1/s1 (slot 1, ports 10000-10099): already exists", true},
		{[]string{"sliver", "create", "h9/s3", "--ports", "10400"}, `host: no host "h9"`, true},
		{[]string{"sliver", "set", "h1/s1", "--ports", "10000-10049"}, "sliver h1/s1: slot 1, ports 10000-10049\n", false},
		{[]string{"sliver", "set", "h1/nope", "--ports", "10000"}, "sliver: sliver h1/nope: not found", true},
		{[]string{"sliver", "list"}, "SLIVER  SLOT  PORTS\nh1/s1   1     10000-10049\nh1/s2   2     10100-10149,10150\n", false},
		{[]string{"sliver", "list", "--host", "h1"}, "h1/s2   2     10100-10149,10150\n", false},
		{[]string{"sliver", "list", "--host", "h9"}, `host: no host "h9"`, true},
		{[]string{"get", "slivers"}, "", false}, // get prints to stdout: only its success is checked
		{[]string{"sliver", "delete", "h1/s1"}, "sliver h1/s1 deleted\n", false},
		{[]string{"sliver", "delete", "h1/s1"}, "sliver: sliver h1/s1: not found", true},
		{[]string{"sliver", "create", "h1/s4", "--ports", "10000"}, "sliver h1/s4: slot 1, ports 10000\n", false},
	}
	runSteps(t, addr, steps)
	out, err := runOut("sliver", "list", "-o", "json", "--api", addr)
	if err != nil {
		t.Fatal(err)
	}
	var list []struct {
		intent.Sliver
		Ports string `json:"ports"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil || len(list) != 2 || list[0].Name != "s4" || list[0].Slot != 1 || list[0].Ports != "10000" {
		t.Fatalf("list -o json: %v %+v\n%s", err, list, out)
	}
	stored, _, err := store.ListJSON[intent.Sliver](t.Context(), s, intent.SliversPrefix)
	if err != nil || len(stored) != 2 {
		t.Fatalf("stored %+v, %v", stored, err)
	}
}

// The CLI checks names and lease lists with the controller's own checks,
// naming the flag, before it contacts the controller (none listens here).
func TestCLIChecksSliverArgumentsBeforeAsking(t *testing.T) {
	noAPI := []string{"--api", "http://127.0.0.1:1"}
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"sliver", "create", "h1/s1"}, "--ports is required"},
		{[]string{"sliver", "create", "h1", "--ports", "10000"}, `"h1": want HOST/NAME`},
		{[]string{"sliver", "create", "h1/S1", "--ports", "10000"}, `sliver name "S1" must be 1-12 lowercase letters or digits`},
		{[]string{"sliver", "create", "h1/s1", "--ports", "10100-10000"}, "--ports: lease 1 \"10100-10000\": range 10100-10000 runs backwards"},
		{[]string{"sliver", "create", "h1/s1", "--ports", "7:10000"}, `--ports: lease 1 "7:10000": uplink "7": want a number 0..3`},
		{[]string{"sliver", "set", "h1/s1", "--ports", "10000-10099,10050"}, "--ports: leases 10000-10099 and 10050 overlap on ports 10050"},
		{[]string{"sliver", "delete", "h1/s1/x"}, `want HOST/NAME`},
		{[]string{"sliver", "list", "-o", "yaml"}, `invalid argument "yaml" for "-o, --output" flag: want text or json`},
	}
	for _, c := range cases {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			err := run(append(c.args, noAPI...)...)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want %q", err, c.want)
			}
		})
	}
}

func TestSliverHelpTeachesLeasesSharingAndOverlaps(t *testing.T) {
	out, err := runOut("sliver", "create", "--help")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"onehop sliver create h1/s1 --ports 10000-10099",
		"[UPLINK:]LO-HI[,...]",
		"1:20000-20099",
		"shares its host's public IPv4 address and MAC",
		"ephemeral range",
		"another sliver of the host leases",
		"In a lab, create also builds the sliver's namespace",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("sliver create --help lacks %q:\n%s", want, out)
		}
	}
}

func TestStatsShowsEverySliversTrafficAndDropsByReason(t *testing.T) {
	sts := []intent.AgentStatus{{Node: "h1", Time: time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC), Slivers: []intent.SliverStats{
		{Name: "s2", PacketsIn: 5, BytesIn: 500, PacketsOut: 6, BytesOut: 600},
		{Name: "s1", PacketsIn: 10, BytesIn: 1000, PacketsOut: 20, BytesOut: 2000,
			Drops: map[string]uint64{"ps_foreign_port": 3, "ps_foreign_mac": 1, "ps_foreign_ip": 0}},
	}}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/status" {
			http.NotFound(w, r)
			return
		}
		json.NewEncoder(w).Encode(sts)
	}))
	t.Cleanup(srv.Close)
	out, err := runOut("stats", "--api", srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	want := "  sliver s1           in 10 packets 1000 bytes, out 20 packets 2000 bytes\n" +
		"    dropped ps_foreign_mac     1\n" +
		"    dropped ps_foreign_port    3\n" +
		"  sliver s2           in 5 packets 500 bytes, out 6 packets 600 bytes\n"
	if !strings.Contains(out, want) {
		t.Fatalf("stats printed\n%s\nwant it to contain\n%s", out, want)
	}
}

// fakeSliverLab records what the CLI asks the lab for; fail makes
// AddSliver fail.
type fakeSliverLab struct {
	added   []intent.Sliver
	removed []string
	fail    error
}

func (f *fakeSliverLab) AddSliver(st *lab.State, s intent.Sliver) error {
	if f.fail != nil {
		return f.fail
	}
	f.added = append(f.added, s)
	return nil
}

func (f *fakeSliverLab) RemoveSliver(st *lab.State, host, name string) error {
	f.removed = append(f.removed, host+"/"+name)
	return nil
}

// In a lab, create builds the namespace of the sliver the controller
// recorded (with its slot), delete removes it, and a namespace that cannot
// be built takes the record away again.
func TestSliverCreateAndDeleteInALabCallTheLabsHook(t *testing.T) {
	addr, s := testController(t)
	c, err := apiClient(addr)
	if err != nil {
		t.Fatal(err)
	}
	fake := &fakeSliverLab{}
	saved := labSliverHook
	labSliverHook = fake
	t.Cleanup(func() { labSliverHook = saved })
	st := &lab.State{Name: "t"}
	var out bytes.Buffer
	if err := createSliver(c, st, "h1", "s1", "10000-10099", &out); err != nil {
		t.Fatal(err)
	}
	if len(fake.added) != 1 || fake.added[0].FullName() != "h1/s1" || fake.added[0].Slot != 1 || len(fake.added[0].Leases) != 1 {
		t.Fatalf("lab asked to add %+v", fake.added)
	}
	if !strings.Contains(out.String(), "sliver h1/s1: namespace built in lab t") {
		t.Fatalf("printed %q", out.String())
	}
	if err := deleteSliver(c, st, "h1", "s1", &out); err != nil || len(fake.removed) != 1 || fake.removed[0] != "h1/s1" {
		t.Fatalf("delete: %v, lab asked to remove %v", err, fake.removed)
	}
	fake.fail = errors.New("namespace oh-t-s2 already exists")
	err = createSliver(c, st, "h1", "s2", "10000-10099", &out)
	if err == nil || err.Error() != "sliver h1/s2: lab: namespace oh-t-s2 already exists; its record was removed again" {
		t.Fatalf("create with a failing lab: %v", err)
	}
	if left, _, _ := store.ListJSON[intent.Sliver](t.Context(), s, intent.SliversPrefix); len(left) != 0 {
		t.Fatalf("records left: %+v", left)
	}
	// Without a lab (--api), nothing is asked of it.
	fake.added = nil
	if err := createSliver(c, nil, "h1", "s3", "10000", &out); err != nil || fake.added != nil {
		t.Fatalf("create without a lab: %v, lab asked %+v", err, fake.added)
	}
}
