package lab

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/topology"
)

const topo = `name: t
hosts: [{name: h1}, {name: h2, uplinks: 2}]
farms: [{name: blue, subnets: [{name: web}]}]
vms:
  - {name: web1, host: h1, subnet: blue/web}
  - {name: web2, host: h2, subnet: blue/web}
slivers:
  - {name: s1, host: h1, ports: 10000-10099}
  - {name: s2, host: h2, ports: "1:20000-20099"}
externals: [{name: inet}]
`

func parse(t *testing.T, s string) *topology.File {
	t.Helper()
	f, err := topology.Parse("t.yaml", []byte(s))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestEveryNodeBelongsToExactlyOneKindInBuildOrder(t *testing.T) {
	f := parse(t, topo)
	var got []string
	seenKind := map[string]bool{}
	for _, k := range kinds {
		if seenKind[k.kind()] {
			t.Errorf("two kinds are called %q", k.kind())
		}
		seenKind[k.kind()] = true
		if kindNamed(k.kind()) != k {
			t.Errorf("kindNamed(%q) does not find it", k.kind())
		}
		for _, n := range k.nodes(f) {
			got = append(got, k.kind()+":"+n)
		}
	}
	want := []string{"fabric:fabric", "controller:controller", "host:h1", "host:h2", "external:inet", "vm:web1", "vm:web2", "sliver:s1", "sliver:s2"}
	if !slices.Equal(got, want) {
		t.Errorf("nodes in build order %v, want %v", got, want)
	}
	// A bridge lab has no controller.
	f = parse(t, topo+"datapath: bridge\n")
	for _, k := range kinds {
		if k.kind() == "controller" && len(k.nodes(f)) != 0 {
			t.Errorf("a bridge lab has controller nodes %v", k.nodes(f))
		}
	}
	if kindNamed("router") != nil {
		t.Error("kindNamed found a kind that is not registered")
	}
}

func TestDaemonArgumentsComeFromTheStateAndTopology(t *testing.T) {
	f := parse(t, topo+"arp: {table_size: 128}\n")
	st := &State{Dir: "/run/onehop/t", EtcdURL: "http://192.168.100.1:2379", EtcdSocket: "/run/onehop/t/etcd.sock",
		APISocket: "/run/onehop/t/api.sock", BPFFS: "/run/onehop/t/bpffs", Topology: "/x/t.yaml"}
	ctl := strings.Join(controllerArgs(st), " ")
	for _, want := range []string{"controller ", "--data-dir /run/onehop/t/etcd", "--client-url http://192.168.100.1:2379",
		"--socket /run/onehop/t/etcd.sock", "--api-socket /run/onehop/t/api.sock", "--topology /x/t.yaml"} {
		if !strings.Contains(ctl, want) {
			t.Errorf("controller args %q lack %q", ctl, want)
		}
	}
	st.Name = "t"
	agent := strings.Join(agentArgs(st, f, "h2"), " ")
	for _, want := range []string{"agent ", "--node h2", "--etcd-endpoints http://192.168.100.1:2379", "--uplink uplink0 --uplink uplink1 ",
		"--sliver-cgroups /run/onehop/t/cgroup/onehop-t/h2 ", "--bpffs /run/onehop/t/bpffs", "--metrics-addr 127.0.0.1:9100", "--mapping-table-size 128"} {
		if !strings.Contains(agent, want) {
			t.Errorf("agent args %q lack %q", agent, want)
		}
	}
	// One uplink, one --uplink: the first is the router's (index 0).
	if one := strings.Join(agentArgs(st, f, "h1"), " "); strings.Count(one, "--uplink ") != 1 || !strings.Contains(one, "--uplink uplink0 ") {
		t.Errorf("h1's agent args %q: want exactly --uplink uplink0", one)
	}
}

func TestVifComesUpOnlyOnceTheAgentHasItsDatapathOnIt(t *testing.T) {
	d := &intent.Desired{Node: "h3", Local: []intent.LocalEndpoint{{Name: "web1", Interface: "vif-web1"}}}
	older := &intent.Desired{Node: "h3"}
	applied := func(dd *intent.Desired, attached ...string) *intent.AgentStatus {
		return &intent.AgentStatus{Node: "h3", AppliedDigest: dd.Digest(), AttachedVifs: attached}
	}
	cases := []struct {
		name  string
		d     *intent.Desired
		st    *intent.AgentStatus
		vifs  []string
		exact bool
		want  string // "" ready, else a part of why not
	}{
		{"no desired state", nil, applied(d, "vif-web1"), []string{"vif-web1"}, false, "no desired state"},
		{"no report", d, nil, []string{"vif-web1"}, false, "has not reported"},
		{"agent error", d, &intent.AgentStatus{Error: "map full"}, []string{"vif-web1"}, false, "map full"},
		{"controller has not placed the VM", older, applied(older), []string{"vif-web1"}, false, "has not placed vif-web1"},
		{"older desired state applied", d, applied(older), []string{"vif-web1"}, false, "has not applied"},
		{"applied but the vif is missing", d, &intent.AgentStatus{AppliedDigest: d.Digest(), MissingVifs: []string{"vif-web1"}},
			[]string{"vif-web1"}, false, "not yet on vif-web1"},
		{"applied but not attached", d, applied(d), []string{"vif-web1"}, false, "not yet on vif-web1"},
		{"attached", d, applied(d, "vif-web1"), []string{"vif-web1"}, false, ""},
		{"exact: one vif too many", d, applied(d, "vif-web1", "vif-old"), []string{"vif-web1"}, true, "want 1"},
		{"exact: all", d, applied(d, "vif-web1"), []string{"vif-web1"}, true, ""},
		{"a host with no VMs", older, applied(older), nil, true, ""},
		{"exact: a sliver's link is not a vif", d, applied(d, "vif-web1", "s0-s1"), []string{"vif-web1"}, true, ""},
		{"exact: a missing sliver link is not the host's to wait for", d,
			&intent.AgentStatus{AppliedDigest: d.Digest(), AttachedVifs: []string{"vif-web1"}, MissingVifs: []string{"s1-s2"}},
			[]string{"vif-web1"}, true, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := agentWaitsFor(c.d, c.st, c.vifs, c.exact)
			if c.want == "" && got != "" {
				t.Fatalf("not ready: %s", got)
			}
			if c.want != "" && !strings.Contains(got, c.want) {
				t.Fatalf("got %q, want it to say %q", got, c.want)
			}
		})
	}
}

type failingWriter struct{ writes int }

func (w *failingWriter) Write([]byte) (int, error) { w.writes++; return 0, errors.New("broken pipe") }

func TestProgressStopsWritingAfterAFailedWrite(t *testing.T) {
	w := &failingWriter{}
	p := &progress{w: w}
	p.printf("one\n")
	p.printf("two\n")
	if w.writes != 1 {
		t.Fatalf("%d writes to a broken writer, want 1", w.writes)
	}
	var quiet *progress
	quiet.printf("nothing\n") // a nil progress is quiet, not a panic
	(&progress{}).printf("nothing\n")
}

func TestSliverLinksComeUpOnlyOnceTheAgentHasAppliedTheSliver(t *testing.T) {
	d := &intent.Desired{Node: "h1", Slivers: []intent.LocalSliver{{Name: "s1", Slot: 1, Leases: []intent.Lease{{Lo: 10000, Hi: 10099}}}}}
	older := &intent.Desired{Node: "h1"}
	applied := func(dd *intent.Desired) *intent.AgentStatus {
		return &intent.AgentStatus{Node: "h1", AppliedDigest: dd.Digest()}
	}
	links := []string{"s0-s1"}
	cases := []struct {
		name string
		d    *intent.Desired
		st   *intent.AgentStatus
		want string
	}{
		{"no desired state", nil, applied(d), "no desired state"},
		{"no report", d, nil, "has not reported"},
		{"agent error", d, &intent.AgentStatus{Error: "map full"}, "map full"},
		{"controller has not placed the sliver", older, applied(older), "has not placed sliver s1"},
		{"older desired state applied", d, applied(older), "has not applied"},
		{"the agent misses the link", d, &intent.AgentStatus{AppliedDigest: d.Digest(), MissingVifs: links}, "not yet on s0-s1"},
		{"applied", d, applied(d), ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := sliverWaitsFor(c.d, c.st, "s1", links)
			if c.want == "" && got != "" {
				t.Fatalf("not ready: %s", got)
			}
			if c.want != "" && !strings.Contains(got, c.want) {
				t.Fatalf("got %q, want it to say %q", got, c.want)
			}
		})
	}
}

func TestInterfaceNamesFitLinux(t *testing.T) {
	long := "abcdefghijkl" // 12: the longest host, external or sliver name
	names := []string{fabricPort(long, 0), fabricPort(long, 3), intent.SliverIfname(long, 3), SliverInterface(3)}
	for _, n := range names {
		if len(n) > 15 {
			t.Errorf("%q is %d bytes; Linux takes 15", n, len(n))
		}
	}
	if fabricPort("h1", 0) != "p-h1" || fabricPort("h1", 1) != "p1-h1" || SliverInterface(1) != "eth1" {
		t.Errorf("names %v", names)
	}
	s := intent.Sliver{Name: "s2", Leases: []intent.Lease{{Uplink: 1, Lo: 5, Hi: 6}, {Uplink: 0, Lo: 1, Hi: 2}, {Uplink: 1, Lo: 9, Hi: 9}}}
	if got := sliverLinks(s); !slices.Equal(got, []string{"s0-s2", "s1-s2"}) {
		t.Errorf("links of %+v: %v", s, got)
	}
}
