package cni

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/client"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/topology"
)

const goodConf = `{"cniVersion":"1.1.0","name":"blue-web","type":"onehop","farm":"blue","subnet":"web",
 "api":"https://192.168.100.1:8443","ca":"/etc/onehop/ca.crt","tokenFile":"/etc/onehop/api-token","host":"h1"}`

func noHostname() (string, error) { return "", errors.New("no hostname here") }

// with is goodConf with fields set (a nil value removes the field).
func with(t *testing.T, fields map[string]any) []byte {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(goodConf), &m); err != nil {
		t.Fatal(err)
	}
	for k, v := range fields {
		if v == nil {
			delete(m, k)
		} else {
			m[k] = v
		}
	}
	b, _ := json.Marshal(m)
	return b
}

func TestParseConfNamesTheFieldThatIsWrong(t *testing.T) {
	for _, tc := range []struct {
		name   string
		conf   []byte
		code   uint
		naming string
	}{
		{"not JSON", []byte(`{"cniVersion":`), ErrDecodingFailure, "not a JSON object"},
		{"a typo", with(t, map[string]any{"subent": "web"}), ErrUnsupportedField, `unknown field "subent"`},
		{"no version", with(t, map[string]any{"cniVersion": nil}), ErrInvalidConfig, "cniVersion is missing"},
		{"a version it does not speak", with(t, map[string]any{"cniVersion": "2.0.0"}), ErrIncompatibleVersion, `cniVersion "2.0.0"`},
		{"no name", with(t, map[string]any{"name": nil}), ErrInvalidConfig, "name is missing"},
		{"no farm", with(t, map[string]any{"farm": nil}), ErrInvalidConfig, "farm is missing"},
		{"a farm that is no name", with(t, map[string]any{"farm": "Blue!"}), ErrInvalidConfig, `farm: farm name "Blue!"`},
		{"no subnet", with(t, map[string]any{"subnet": nil}), ErrInvalidConfig, "subnet is missing"},
		{"a number for a string", with(t, map[string]any{"subnet": 7}), ErrDecodingFailure, `"subnet" must be a string, not 7`},
		{"no api", with(t, map[string]any{"api": nil}), ErrInvalidConfig, "api is missing"},
		{"an api that is no address", with(t, map[string]any{"api": "controller:8443"}), ErrInvalidConfig, `api "controller:8443"`},
		{"https without credentials", with(t, map[string]any{"tokenFile": nil}), ErrInvalidConfig, "give tokenFile"},
		{"a cert without its key", with(t, map[string]any{"cert": "/etc/onehop/c.crt"}), ErrInvalidConfig, "cert and key go together"},
		{"a relative ca", with(t, map[string]any{"ca": "ca.crt"}), ErrInvalidConfig, `ca "ca.crt": want an absolute path`},
		{"a host that is no host name", with(t, map[string]any{"host": "H_1"}), ErrInvalidConfig, `host: host name "H_1"`},
		{"no host and no hostname", with(t, map[string]any{"host": nil}), ErrInvalidConfig, "host is missing and the hostname cannot be read"},
		{"a timeout that is no duration", with(t, map[string]any{"attachTimeout": "10"}), ErrInvalidConfig, `attachTimeout "10"`},
		{"a timeout of an hour", with(t, map[string]any{"attachTimeout": "1h"}), ErrInvalidConfig, `attachTimeout "1h"`},
		{"a nameserver that is no address", with(t, map[string]any{"dns": map[string]any{"nameservers": []string{"dns.example"}}}), ErrInvalidConfig, `dns.nameservers[0] "dns.example"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConf(tc.conf, noHostname)
			var e *Error
			if !errors.As(err, &e) || e.Code != tc.code || !strings.Contains(e.Error(), tc.naming) {
				t.Fatalf("ParseConf: %v (%#v), want code %d naming %q", err, e, tc.code, tc.naming)
			}
		})
	}
}

func TestParseConfDefaultsAndWhatARuntimeAdds(t *testing.T) {
	c, err := ParseConf(with(t, map[string]any{"host": nil, "attachTimeout": "250ms",
		"runtimeConfig": map[string]any{}, "prevResult": map[string]any{"cniVersion": "1.1.0"}, "cni.dev/valid-attachments": []any{}}),
		func() (string, error) { return "H7.example.net", nil })
	if err != nil {
		t.Fatal(err)
	}
	if c.Host != "h7" || c.Attach != 250*time.Millisecond {
		t.Errorf("host %q (want h7, the hostname's first label) attach %s (want 250ms)", c.Host, c.Attach)
	}
	c, err = ParseConf([]byte(goodConf), noHostname)
	if err != nil || c.Attach != DefaultAttachTimeout || c.Host != "h1" {
		t.Errorf("defaults: %v, attach %s host %s", err, c.Attach, c.Host)
	}
	for _, api := range []string{"/run/onehop/api.sock", "unix:///run/onehop/api.sock", "http://127.0.0.1:8080"} {
		if _, err := ParseConf(with(t, map[string]any{"api": api, "tokenFile": nil, "ca": nil}), noHostname); err != nil {
			t.Errorf("api %s: %v", api, err)
		}
	}
}

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestParseEnvNamesTheVariableThatIsWrong(t *testing.T) {
	full := map[string]string{"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "abc", "CNI_NETNS": "/run/netns/x", "CNI_IFNAME": "eth0"}
	for _, tc := range []struct {
		name   string
		change map[string]string
		naming string
	}{
		{"no command", map[string]string{"CNI_COMMAND": ""}, "CNI_COMMAND is not set"},
		{"an unknown command", map[string]string{"CNI_COMMAND": "ATTACH"}, `CNI_COMMAND "ATTACH"`},
		{"no container", map[string]string{"CNI_CONTAINERID": ""}, "CNI_CONTAINERID is not set"},
		{"a container id with a slash", map[string]string{"CNI_CONTAINERID": "a/b"}, `CNI_CONTAINERID "a/b"`},
		{"no interface", map[string]string{"CNI_IFNAME": ""}, "CNI_IFNAME is not set"},
		{"an interface too long", map[string]string{"CNI_IFNAME": "eth0123456789012"}, `CNI_IFNAME "eth0123456789012"`},
		{"no namespace", map[string]string{"CNI_NETNS": ""}, "CNI_NETNS is not set"},
		{"CNI_ARGS not pairs", map[string]string{"CNI_ARGS": "K8S_POD_NAME"}, `CNI_ARGS: "K8S_POD_NAME"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := map[string]string{}
			for k, v := range full {
				m[k] = v
			}
			for k, v := range tc.change {
				m[k] = v
			}
			_, err := ParseEnv(env(m))
			var e *Error
			if !errors.As(err, &e) || e.Code != ErrInvalidEnvironment || !strings.Contains(e.Msg, tc.naming) {
				t.Fatalf("ParseEnv: %v, want code 4 naming %q", err, tc.naming)
			}
		})
	}
	// DEL needs no namespace: the runtime may have removed it first.
	if _, err := ParseEnv(env(map[string]string{"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "abc", "CNI_IFNAME": "eth0"})); err != nil {
		t.Errorf("DEL without CNI_NETNS: %v", err)
	}
}

func TestVMNamesAreValidStableAndDistinct(t *testing.T) {
	seen := map[string]string{}
	check := func(what, name string) {
		t.Helper()
		if err := topology.CheckVMName(name); err != nil {
			t.Errorf("%s: %v", what, err)
		}
		if prev, ok := seen[name]; ok {
			t.Errorf("%s and %s both get %s", what, prev, name)
		}
		seen[name] = what
	}
	for i := range 1000 {
		id := fmt.Sprintf("cnitool-%020x", i)
		check(id, VMName(id, nil))
	}
	pods := []map[string]string{
		{"K8S_POD_NAME": "web-7f9c", "K8S_POD_NAMESPACE": "default"},
		{"K8S_POD_NAME": "web-7f9c", "K8S_POD_NAMESPACE": "shop"},
		{"K8S_POD_NAME": "0day", "K8S_POD_NAMESPACE": "default"},
		{"K8S_POD_NAME": "---", "K8S_POD_NAMESPACE": "default"},
		{"K8S_POD_NAME": "ÜberPod", "K8S_POD_NAMESPACE": "default"},
	}
	for _, a := range pods {
		check(a["K8S_POD_NAMESPACE"]+"/"+a["K8S_POD_NAME"], VMName("ctr1", a))
	}
	if n := VMName("ctr1", pods[0]); !strings.HasPrefix(n, "web7f") || n != VMName("ctr1", pods[0]) {
		t.Errorf("pod web-7f9c: %s, want web7f... and the same every time", n)
	}
	// A new sandbox of the same pod is another VM: a late DEL of the old
	// one must not take the new one's.
	if VMName("ctr1", pods[0]) == VMName("ctr2", pods[0]) {
		t.Error("two sandboxes of one pod share a VM name")
	}
}

var testVM = intent.VM{Farm: "blue", Subnet: "web", Name: "c0123456789", Host: "h1", Interface: "vif-c0123456789",
	IP: "10.1.1.5", MAC: "0a:58:0a:01:01:05", Gateway: "10.1.1.1"}

func TestResultsInEachVersionAndAfterAnotherPlugin(t *testing.T) {
	c, _ := ParseConf(with(t, map[string]any{"dns": map[string]any{"nameservers": []string{"10.1.1.1"}}}), noHostname)
	r, err := BuildResult(c, nil, testVM, "aa:bb:cc:dd:ee:ff", "eth0", "/run/netns/c1")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(r)
	want := `{"cniVersion":"1.1.0","interfaces":[{"name":"vif-c0123456789","mac":"aa:bb:cc:dd:ee:ff"},{"name":"eth0","mac":"0a:58:0a:01:01:05","sandbox":"/run/netns/c1"}],` +
		`"ips":[{"interface":1,"address":"10.1.1.5/24","gateway":"10.1.1.1"}],"routes":[{"dst":"0.0.0.0/0","gw":"10.1.1.1"}],"dns":{"nameservers":["10.1.1.1"]}}`
	if string(b) != want {
		t.Errorf("1.1.0 result\n got %s\nwant %s", b, want)
	}
	c.CNIVersion = "0.4.0"
	prev := &Result{Interfaces: []Interface{{Name: "lo0"}}, IPs: []IPConfig{{Address: "192.0.2.1/32"}}}
	r, _ = BuildResult(c, prev, testVM, "aa:bb:cc:dd:ee:ff", "eth0", "/run/netns/c1")
	if len(r.Interfaces) != 3 || *r.IPs[1].Interface != 2 || r.IPs[0].Version != "4" || r.IPs[1].Version != "4" || r.CNIVersion != "0.4.0" {
		t.Errorf("0.4.0 result after another plugin's: %+v", r)
	}
	if err := checkPrev(&r, testVM, "eth0", "/run/netns/c1"); err != nil {
		t.Errorf("CHECK of ADD's own result: %v", err)
	}
	if err := checkPrev(&r, testVM, "eth0", "/run/netns/c2"); err == nil {
		t.Error("CHECK of a result for another namespace passed")
	}
}

func TestCheckLinkNamesWhatDiffers(t *testing.T) {
	good := LinkState{HostKind: "veth", HostUp: true, PeerFound: true, PeerMAC: testVM.MAC,
		Addrs: []netip.Prefix{netip.MustParsePrefix("10.1.1.5/24")}, Gateway: netip.MustParseAddr("10.1.1.1")}
	if err := CheckLink(testVM, "eth0", good); err != nil {
		t.Fatalf("a link as ADD made it: %v", err)
	}
	for _, tc := range []struct {
		change func(*LinkState)
		naming string
	}{
		{func(s *LinkState) { s.HostKind = "" }, "no interface vif-c0123456789 on the host"},
		{func(s *LinkState) { s.HostKind = "tun" }, "is a tun, not a veth"},
		{func(s *LinkState) { s.HostUp = false }, "the agent has not attached"},
		{func(s *LinkState) { s.PeerFound = false }, "no eth0 in the container's namespace"},
		{func(s *LinkState) { s.PeerMAC = "02:00:00:00:00:01" }, "eth0 has MAC 02:00:00:00:00:01"},
		{func(s *LinkState) { s.Addrs = nil }, "eth0 has no address 10.1.1.5/24"},
		{func(s *LinkState) { s.Addrs = append(s.Addrs, netip.MustParsePrefix("10.1.1.9/24")) }, "the address 10.1.1.9/24"},
		{func(s *LinkState) { s.Gateway = netip.Addr{} }, "no default route via 10.1.1.1"},
		{func(s *LinkState) { s.Gateway = netip.MustParseAddr("10.1.1.254") }, "via 10.1.1.254, want 10.1.1.1"},
	} {
		st := good
		st.Addrs = append([]netip.Prefix(nil), good.Addrs...)
		tc.change(&st)
		err := CheckLink(testVM, "eth0", st)
		var e *Error
		if !errors.As(err, &e) || e.Code != ErrCheckFailed || !strings.Contains(e.Msg, tc.naming) {
			t.Errorf("CheckLink: %v, want code %d naming %q", err, ErrCheckFailed, tc.naming)
		}
	}
}

// fakeController is the controller's intent in memory.
type fakeController struct {
	farms, subnets, hosts map[string]bool
	vms                   map[string]intent.VM
	down                  bool // unreachable
	next                  int
}

func newFakeController() *fakeController {
	return &fakeController{farms: map[string]bool{"blue": true}, subnets: map[string]bool{"blue/web": true},
		hosts: map[string]bool{"h1": true}, vms: map[string]intent.VM{}}
}

var errUnreachable = errors.New("controller API unreachable: connection refused")

func (f *fakeController) CreateVM(_ context.Context, farm, subnet, name, host, iface string, container intent.VMContainer) (intent.VM, error) {
	if f.down {
		return intent.VM{}, errUnreachable
	}
	if !f.subnets[farm+"/"+subnet] {
		return intent.VM{}, &client.APIError{Status: 404, Field: "subnet", Msg: "subnet " + farm + "/" + subnet + ": not found"}
	}
	if !f.hosts[host] {
		return intent.VM{}, &client.APIError{Status: 400, Field: "host", Msg: fmt.Sprintf("no host %q", host)}
	}
	full := farm + "/" + subnet + "/" + name
	if _, ok := f.vms[full]; ok {
		return intent.VM{}, &client.APIError{Status: 409, Field: "name", Msg: "vm " + name + ": already exists"}
	}
	f.next++
	v := intent.VM{Farm: farm, Subnet: subnet, Name: name, Host: host, Interface: iface,
		IP: fmt.Sprintf("10.1.1.%d", f.next+1), MAC: fmt.Sprintf("0a:58:0a:01:01:%02x", f.next+1), Gateway: "10.1.1.1", Container: &container}
	f.vms[full] = v
	return v, nil
}

func (f *fakeController) VMs(_ context.Context, farm string) ([]intent.VM, error) {
	if f.down {
		return nil, errUnreachable
	}
	var out []intent.VM
	for _, v := range f.vms {
		if v.Farm == farm {
			out = append(out, v)
		}
	}
	return out, nil
}

func (f *fakeController) DeleteVM(_ context.Context, farm, subnet, name string) error {
	if f.down {
		return errUnreachable
	}
	full := farm + "/" + subnet + "/" + name
	if _, ok := f.vms[full]; !ok {
		return ErrNoVM
	}
	delete(f.vms, full)
	return nil
}

func (f *fakeController) VM(_ context.Context, farm, subnet, name string) (intent.VM, error) {
	if f.down {
		return intent.VM{}, errUnreachable
	}
	v, ok := f.vms[farm+"/"+subnet+"/"+name]
	if !ok {
		return v, ErrNoVM
	}
	return v, nil
}

func (f *fakeController) Where(_ context.Context, farm, subnet, host string) (string, error) {
	switch {
	case f.down:
		return "", errUnreachable
	case !f.farms[farm]:
		return fmt.Sprintf("farm %q: the controller has no such farm", farm), nil
	case !f.subnets[farm+"/"+subnet]:
		return fmt.Sprintf("subnet %q: farm %s has no such subnet", subnet, farm), nil
	case !f.hosts[host]:
		return fmt.Sprintf("host %q: the controller has no such host", host), nil
	}
	return "", nil
}

// fakeLinks are links in memory; the agent "attaches" when attaches is
// set (else WaitUp waits for its context).
type fakeLinks struct {
	netns    map[string]bool
	links    map[string]LinkSpec // by host interface
	attaches bool
	up       map[string]bool
}

func newFakeLinks() *fakeLinks {
	return &fakeLinks{netns: map[string]bool{"/run/netns/c1": true}, links: map[string]LinkSpec{}, attaches: true, up: map[string]bool{}}
}

func (f *fakeLinks) NetnsExists(p string) bool { return f.netns[p] }
func (f *fakeLinks) Add(s LinkSpec) (string, error) {
	if _, ok := f.links[s.HostIf]; ok {
		return "", errors.New("exists")
	}
	f.links[s.HostIf] = s
	return "aa:bb:cc:dd:ee:ff", nil
}
func (f *fakeLinks) WaitUp(ctx context.Context, hostIf, netns, ifname string) error {
	if f.attaches {
		f.up[hostIf] = true
		return nil
	}
	<-ctx.Done()
	return ctx.Err()
}
func (f *fakeLinks) Delete(hostIf, netns, ifname string) error {
	delete(f.links, hostIf)
	delete(f.up, hostIf)
	return nil
}
func (f *fakeLinks) Inspect(hostIf, netns, ifname string) (LinkState, error) {
	s, ok := f.links[hostIf]
	if !ok {
		return LinkState{}, nil
	}
	return LinkState{HostKind: "veth", HostUp: f.up[hostIf], PeerFound: s.Netns == netns && s.IfName == ifname, PeerMAC: s.MAC,
		Addrs: []netip.Prefix{s.Address}, Gateway: s.Gateway}, nil
}

type fixture struct {
	ctl   *fakeController
	links *fakeLinks
	p     *Plugin
}

func newFixture() *fixture {
	f := &fixture{ctl: newFakeController(), links: newFakeLinks()}
	f.p = &Plugin{NewController: func(NetConf) (Controller, error) { return f.ctl, nil }, Links: f.links, Hostname: noHostname}
	return f
}

// run runs cmd with conf; it returns the exit status and stdout.
func (f *fixture) run(cmd string, conf []byte) (int, string) {
	e := map[string]string{"CNI_COMMAND": cmd, "CNI_CONTAINERID": "ctr1", "CNI_NETNS": "/run/netns/c1", "CNI_IFNAME": "eth0"}
	var out bytes.Buffer
	code := f.p.Run(context.Background(), env(e), bytes.NewReader(conf), &out)
	return code, out.String()
}

// fail runs cmd with conf and decodes the error object it must fail with.
func (f *fixture) fail(t *testing.T, cmd string, conf []byte) Error {
	t.Helper()
	code, out := f.run(cmd, conf)
	var e struct {
		CNIVersion string `json:"cniVersion"`
		Error
	}
	if code == 0 || json.Unmarshal([]byte(out), &e) != nil || e.CNIVersion == "" {
		t.Fatalf("exit %d, want an error object on stdout:\n%s", code, out)
	}
	return e.Error
}

func TestAddCheckDelAgainstTheSeams(t *testing.T) {
	f := newFixture()
	code, out := f.run(CmdAdd, []byte(goodConf))
	if code != 0 {
		t.Fatalf("ADD: exit %d\n%s", code, out)
	}
	var r Result
	if err := json.Unmarshal([]byte(out), &r); err != nil || len(r.IPs) != 1 || r.IPs[0].Address != "10.1.1.2/24" {
		t.Fatalf("ADD result: %v\n%s", err, out)
	}
	name := VMName("ctr1", nil)
	if v, ok := f.ctl.vms["blue/web/"+name]; !ok || v.Host != "h1" || !f.links.up[v.Interface] {
		t.Fatalf("after ADD: vm %+v, links %+v", v, f.links.links)
	}
	// CHECK with the ADD's result passes; without it, it says so.
	check := with(t, map[string]any{"prevResult": json.RawMessage(out)})
	if code, out := f.run(CmdCheck, check); code != 0 {
		t.Fatalf("CHECK: exit %d\n%s", code, out)
	}
	if e := f.fail(t, CmdCheck, []byte(goodConf)); !strings.Contains(e.Msg, "no prevResult") {
		t.Errorf("CHECK without prevResult: %+v", e)
	}
	// A repeated ADD (the runtime retried) uses the VM again.
	delete(f.links.links, intent.VifName("blue", name))
	if code, out := f.run(CmdAdd, []byte(goodConf)); code != 0 || len(f.ctl.vms) != 1 {
		t.Fatalf("a repeated ADD: exit %d, %d VMs\n%s", code, len(f.ctl.vms), out)
	}
	for i := 1; i <= 2; i++ {
		if code, out := f.run(CmdDel, []byte(goodConf)); code != 0 {
			t.Fatalf("DEL #%d: exit %d\n%s", i, code, out)
		}
	}
	if len(f.ctl.vms) != 0 || len(f.links.links) != 0 {
		t.Errorf("after DEL: vms %v links %v", f.ctl.vms, f.links.links)
	}
	if e := f.fail(t, CmdCheck, check); e.Code != ErrCheckFailed || !strings.Contains(e.Msg, "not in the controller's intent") {
		t.Errorf("CHECK after DEL: %+v", e)
	}
}

func TestAddErrorsNameWhatIsWrongAndLeaveNothing(t *testing.T) {
	for _, tc := range []struct {
		name   string
		conf   map[string]any
		setup  func(*fixture)
		code   uint
		naming string
	}{
		{"a farm the controller does not have", map[string]any{"farm": "nofarm"}, nil, ErrInvalidConfig, `farm "nofarm": the controller has no such farm`},
		{"a subnet its farm does not have", map[string]any{"subnet": "db"}, nil, ErrInvalidConfig, `subnet "db": farm blue has no such subnet`},
		{"a host the controller does not have", map[string]any{"host": "h9"}, nil, ErrInvalidConfig, `host "h9"`},
		{"the controller down", nil, func(f *fixture) { f.ctl.down = true }, ErrTryAgainLater, "unreachable"},
		{"no such namespace", nil, func(f *fixture) { f.links.netns = nil }, ErrUnknownContainer, "CNI_NETNS /run/netns/c1: no such network namespace"},
		{"an agent that never attaches", map[string]any{"attachTimeout": "20ms"}, func(f *fixture) { f.links.attaches = false },
			ErrNotAttached, "host h1's agent did not attach to vif-"},
		{"an old version for CHECK", map[string]any{"cniVersion": "0.3.1"}, nil, ErrIncompatibleVersion, "CHECK needs cniVersion 0.4.0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture()
			if tc.setup != nil {
				tc.setup(f)
			}
			cmd := CmdAdd
			if tc.code == ErrIncompatibleVersion {
				cmd = CmdCheck
			}
			e := f.fail(t, cmd, with(t, tc.conf))
			if e.Code != tc.code || !strings.Contains(e.Msg, tc.naming) {
				t.Errorf("%s: %+v, want code %d naming %q", cmd, e, tc.code, tc.naming)
			}
			if len(f.ctl.vms) != 0 || len(f.links.links) != 0 {
				t.Errorf("a failed ADD left vms %v links %v", f.ctl.vms, f.links.links)
			}
		})
	}
}

func TestStatusAndVersion(t *testing.T) {
	f := newFixture()
	if code, out := f.run(CmdStatus, []byte(goodConf)); code != 0 || out != "" {
		t.Errorf("STATUS: exit %d\n%s", code, out)
	}
	if e := f.fail(t, CmdStatus, with(t, map[string]any{"farm": "nofarm"})); e.Code != ErrNotAvailable || !strings.Contains(e.Msg, `farm "nofarm"`) {
		t.Errorf("STATUS with an unknown farm: %+v", e)
	}
	f.ctl.down = true
	if e := f.fail(t, CmdStatus, []byte(goodConf)); e.Code != ErrNotAvailable || !strings.Contains(e.Msg, "unreachable") {
		t.Errorf("STATUS with the controller down: %+v", e)
	}
	if e := f.fail(t, CmdStatus, with(t, map[string]any{"cniVersion": "1.0.0"})); e.Code != ErrIncompatibleVersion {
		t.Errorf("STATUS in 1.0.0: %+v", e)
	}
	code, out := f.run(CmdVersion, []byte(`{"cniVersion":"1.0.0"}`))
	var v versionInfo
	if code != 0 || json.Unmarshal([]byte(out), &v) != nil || v.CNIVersion != Version || len(v.SupportedVersions) != len(SupportedVersions) {
		t.Errorf("VERSION: exit %d\n%s", code, out)
	}
}

// FuzzParseConf: any bytes on stdin are a config or an error object with
// a code of the spec or the plugin's, never a panic.
func FuzzParseConf(f *testing.F) {
	f.Add([]byte(goodConf))
	f.Add([]byte(`{"cniVersion":"0.4.0","name":"n","farm":"a","subnet":"b","api":"/s","dns":{"nameservers":["x"]}}`))
	f.Add([]byte(`{"cniVersion":"1.1.0","attachTimeout":"-1s"}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := ParseConf(b, func() (string, error) { return "h1", nil })
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || e.Code == 0 || e.Msg == "" {
				t.Fatalf("ParseConf(%q): %v is not a CNI error", b, err)
			}
			return
		}
		if c.Attach <= 0 || c.Attach > MaxAttachTimeout || c.Farm == "" || c.Subnet == "" || c.Host == "" || c.API == "" {
			t.Fatalf("ParseConf(%q) accepted %+v", b, c)
		}
	})
}

// GC removes the VMs and links of this network's attachments on this host
// that the runtime no longer lists, and nothing else: not a valid one, not
// another network's, another host's or subnet's, not an operator's VM.
func TestGCRemovesOnlyThisNetworksStaleAttachmentsOnThisHost(t *testing.T) {
	f := newFixture()
	add := func(id, ifname string) intent.VM {
		t.Helper()
		e := map[string]string{"CNI_COMMAND": CmdAdd, "CNI_CONTAINERID": id, "CNI_NETNS": "/run/netns/c1", "CNI_IFNAME": ifname}
		var out bytes.Buffer
		if code := f.p.Run(context.Background(), env(e), bytes.NewReader([]byte(goodConf)), &out); code != 0 {
			t.Fatalf("ADD %s: exit %d\n%s", id, code, out.String())
		}
		return f.ctl.vms["blue/web/"+VMName(id, nil)]
	}
	valid, stale, staleIf := add("keep", "eth0"), add("gone", "eth0"), add("keep2", "eth1")
	if valid.Container == nil || *valid.Container != (intent.VMContainer{Network: "blue-web", ID: "keep", IfName: "eth0"}) {
		t.Fatalf("ADD recorded the attachment %+v", valid.Container)
	}
	others := []intent.VM{
		{Farm: "blue", Subnet: "web", Name: "op1", Host: "h1", Interface: "tap-op1"},
		{Farm: "blue", Subnet: "web", Name: "net2", Host: "h1", Interface: "vif-net2", Container: &intent.VMContainer{Network: "other", ID: "x", IfName: "eth0"}},
		{Farm: "blue", Subnet: "web", Name: "h2vm", Host: "h2", Interface: "vif-h2vm", Container: &intent.VMContainer{Network: "blue-web", ID: "y", IfName: "eth0"}},
		{Farm: "blue", Subnet: "db", Name: "dbvm", Host: "h1", Interface: "vif-dbvm", Container: &intent.VMContainer{Network: "blue-web", ID: "z", IfName: "eth0"}},
	}
	for _, v := range others {
		f.ctl.vms[v.FullName()] = v
		f.links.links[v.Interface] = LinkSpec{HostIf: v.Interface}
	}
	gc := with(t, map[string]any{"cni.dev/valid-attachments": []Attachment{{ContainerID: "keep", IfName: "eth0"}, {ContainerID: "keep2", IfName: "eth0"}}})
	if code, out := f.run(CmdGC, gc); code != 0 {
		t.Fatalf("GC: exit %d\n%s", code, out)
	}
	for _, v := range []intent.VM{stale, staleIf} {
		if _, ok := f.ctl.vms[v.FullName()]; ok {
			t.Errorf("GC left the stale attachment's vm %s", v.FullName())
		}
		if _, ok := f.links.links[v.Interface]; ok {
			t.Errorf("GC left the stale attachment's link %s", v.Interface)
		}
	}
	for _, v := range append(others, valid) {
		if _, ok := f.ctl.vms[v.FullName()]; !ok {
			t.Errorf("GC removed vm %s", v.FullName())
		}
		if _, ok := f.links.links[v.Interface]; !ok {
			t.Errorf("GC removed link %s", v.Interface)
		}
	}
	// libcni without GC arguments sends no list: nothing is valid.
	if code, out := f.run(CmdGC, []byte(goodConf)); code != 0 {
		t.Fatalf("GC without a list: exit %d\n%s", code, out)
	}
	if _, ok := f.ctl.vms[valid.FullName()]; ok || len(f.ctl.vms) != len(others) {
		t.Errorf("GC without a list left %d VMs, want the %d not the network's on this host", len(f.ctl.vms), len(others))
	}
	f.ctl.down = true
	if e := f.fail(t, CmdGC, gc); e.Code != ErrTryAgainLater || !strings.Contains(e.Msg, "list the vms of farm blue") {
		t.Errorf("GC with the controller down: %+v", e)
	}
	if e := f.fail(t, CmdGC, with(t, map[string]any{"cniVersion": "1.0.0"})); e.Code != ErrIncompatibleVersion {
		t.Errorf("GC at 1.0.0: %+v", e)
	}
}
