package lab

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/topology"
)

func cloudFile(t *testing.T) *topology.File {
	t.Helper()
	f, err := topology.Load("../../examples/cloud-access.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// The daemons get what the topology says: one path per WAN with its EID
// and RLOC, the user links intercepted, the controller as map-server, each
// its own key id from the site-keys file the lab writes.
func TestCloudDaemonArgsFollowTheTopology(t *testing.T) {
	f := cloudFile(t)
	st := &State{Name: "cloud", Dir: t.TempDir()}
	g, _ := f.GatewayByName("gw")
	got := strings.Join(gatewayArgs(st, f, g), " ")
	for _, want := range []string{
		"gateway run --eid-prefix 10.77.0.0/24 --lisp",
		"--map-resolver 192.168.100.1:4342 --map-server 192.168.100.1:4342",
		"--map-server-key-file " + filepath.Join(st.Dir, "lisp-key-gw") + " --key-id 1",
		"--rloc-probe-interval 1s --whole-superpackets",
		// users never reach the fabric or the WAN links' ends
		"--infrastructure 192.168.100.0/24 --infrastructure 172.31.1.0/24 --infrastructure 172.31.2.0/24",
		"--intercept u-user",
		"--path dev=wan1,eid=10.77.0.1,rloc=172.31.1.2,name=wan1 --path dev=wan2,eid=10.77.0.2,rloc=172.31.2.2,name=wan2",
		"--metrics-addr 127.0.0.1:9100",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("gateway args %q lack %q", got, want)
		}
	}
	x, _ := f.XTRByName("xtr")
	got = strings.Join(xtrArgs(st, f, x), " ")
	want := "xtr run --eid-prefix 10.88.0.0/24 --map-server 192.168.100.1:4342 --key-file " + filepath.Join(st.Dir, "lisp-key-xtr") + " --key-id 2 --whole-superpackets --site-whole-superpackets --rloc wan1 --rloc wan2 --eid-dev s-srv --metrics-addr 127.0.0.1:9100"
	if got != want {
		t.Errorf("xtr args\n %q\nwant\n %q", got, want)
	}
}

func TestLabLinkNamesTheLinksOfAnUnknownOne(t *testing.T) {
	st := &State{Name: "cloud", Kinds: map[string]string{"wan2": "wan", "wan1": "wan", "gw": "gateway"}}
	if got := strings.Join(Links(st), ","); got != "wan1,wan2" {
		t.Fatalf("links %s", got)
	}
	for _, name := range []string{"wan9", "gw"} {
		err := SetLink(st, name, false)
		if err == nil || !strings.Contains(err.Error(), `lab cloud has no link "`+name+`" (its links: wan1, wan2)`) {
			t.Errorf("SetLink(%s): %v", name, err)
		}
	}
	if err := SetLink(&State{Name: "q", Kinds: map[string]string{"h1": "host"}}, "wan1", true); err == nil || !strings.Contains(err.Error(), "it has no wans") {
		t.Errorf("a lab without wans: %v", err)
	}
}
