package topology

import (
	"os"
	"regexp"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/onehop/onehop/internal/intent"
)

func TestQuickstartExampleIsValid(t *testing.T) {
	f, err := Load("../../examples/quickstart.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if f.Name != "quickstart" || len(f.Hosts) != 3 || len(f.VMs) != 6 || len(f.Farms) != 2 {
		t.Fatalf("parsed %+v", f)
	}
	if f.Hosts[0].Address != "192.168.100.10" || f.Hosts[2].Address != "192.168.100.12" || f.Fabric.Controller != "192.168.100.1" {
		t.Fatalf("default addresses: hosts %+v controller %s", f.Hosts, f.Fabric.Controller)
	}
	if len(f.Farms[0].Rules) != 2 || len(f.Farms[0].Peers) != 0 || len(f.Farms[1].Peers) != 0 {
		t.Fatalf("blue should open web -> db twice and neither farm peer: %+v", f.Farms)
	}
	if f.Datapath != DatapathOnehop {
		t.Fatalf("default datapath %q", f.Datapath)
	}
}

const good = `name: t
hosts:
  - name: h1
farms:
  - name: blue
    subnets:
      - name: web
vms:
  - name: web1
    host: h1
    subnet: blue/web
`

func TestARPTuningBecomesAgentFlags(t *testing.T) {
	f, err := Parse("t.yaml", []byte(good+"arp: {table_size: 128, refresh: 30s, idle: 2m}\n"))
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Join(f.ARP.AgentArgs(), " ")
	if want := "--mapping-table-size 128 --arp-refresh 30s --arp-idle 2m0s"; got != want {
		t.Fatalf("agent args %q, want %q", got, want)
	}
	if f, _ := Parse("t.yaml", []byte(good)); len(f.ARP.AgentArgs()) != 0 {
		t.Fatalf("no arp section, yet agent args %v", f.ARP.AgentArgs())
	}
}

func TestFarmMayEnableProxyARP(t *testing.T) {
	f, err := Parse("t.yaml", []byte(strings.Replace(good, "  - name: blue\n", "  - name: blue\n    proxy_arp: true\n", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if !f.Farms[0].ProxyARP {
		t.Fatal("proxy_arp: true was not read")
	}
}

// errorCases are edits of good that must be refused, with what the error says.
var errorCases = []struct {
	name    string
	edit    func(string) string
	wantErr string
}{
	{"unknown host", func(s string) string { return strings.Replace(s, "host: h1", "host: h9", 1) },
		`t.yaml:10: vm "web1": host "h9" is not defined`},
	{"unknown subnet", func(s string) string { return strings.Replace(s, "subnet: blue/web", "subnet: blue/db", 1) },
		`t.yaml:11: vm "web1": subnet "blue/db" is not defined`},
	{"duplicate vm", func(s string) string { return s + "  - {name: web1, host: h1, subnet: blue/web}\n" },
		`t.yaml:12: duplicate vm "web1" in farm "blue" (first defined on line 9; a VM's name is unique within its farm)`},
	{"a vm named like a host", func(s string) string { return s + "  - {name: h1, host: h1, subnet: blue/web}\n" },
		`t.yaml:12: vm name "h1" is already a host or reserved name`},
	{"bad cidr", func(s string) string { return s + "fabric:\n  cidr: 192.168.300.0/24\n" },
		`t.yaml:13: fabric.cidr "192.168.300.0/24" is not a CIDR`},
	{"fabric in tenant space", func(s string) string { return s + "fabric:\n  cidr: 10.9.0.0/16\n" },
		`outside the tenant space`},
	{"misspelt key", func(s string) string { return strings.Replace(s, "    host: h1", "    hots: h1", 1) },
		`t.yaml:10: unknown key "hots" in vm`},
	{"duplicate host", func(s string) string { return strings.Replace(s, "  - name: h1\n", "  - name: h1\n  - name: h1\n", 1) },
		`t.yaml:4: duplicate host "h1"`},
	{"host outside fabric", func(s string) string {
		return strings.Replace(s, "  - name: h1\n", "  - name: h1\n    address: 172.16.0.5\n", 1)
	}, `host h1 address 172.16.0.5 is not a usable address of fabric 192.168.100.0/24`},
	{"vm name too long for a vif", func(s string) string { return strings.Replace(s, "name: web1", "name: averyveryverylongname", 1) },
		`must be 1-11 lowercase`},
	{"no hosts", func(s string) string { return strings.Replace(s, "hosts:\n  - name: h1\n", "", 1) },
		`no hosts`},
	{"dhcp not a bool", func(s string) string {
		return strings.Replace(s, "    subnet: blue/web\n", "    subnet: blue/web\n    dhcp: maybe\n", 1)
	},
		`t.yaml:12: vm dhcp must be true or false`},
	{"proxy_arp not a bool", func(s string) string {
		return strings.Replace(s, "  - name: blue\n", "  - name: blue\n    proxy_arp: yes\n", 1)
	},
		`t.yaml:6: farm proxy_arp must be true or false`},
	{"arp refresh not a duration", func(s string) string { return s + "arp: {refresh: often}\n" },
		`t.yaml:12: arp.refresh "often" must be a duration of at least 1s`},
	{"arp table too small", func(s string) string { return s + "arp:\n  table_size: 8\n" },
		`t.yaml:13: arp.table_size "8" must be a whole number from 64`},
	{"unknown arp key", func(s string) string { return s + "arp: {wait: 1s}\n" }, `t.yaml:12: unknown key "wait" in arp`},
	{"bad datapath", func(s string) string { return s + "datapath: ovs\n" }, `datapath "ovs" is not one of`},
	{"not yaml", func(string) string { return "hosts: [\n" }, `t.yaml`},
	// A VM's interface: the API's check (intent.CheckInterface), at the
	// interface's line, naming the VM.
	{"interface too long", withInterface("averyveryverylongname"),
		`t.yaml:12: vm "web1": interface "averyveryverylongname": an interface name has at most 15 bytes, this one 21`},
	{"interface with a slash", withInterface("tap/0"),
		`t.yaml:12: vm "web1": interface "tap/0": an interface name has no '/', ':', whitespace or control characters`},
	{"interface with a colon", withInterface("tap:0"), `t.yaml:12: vm "web1": interface "tap:0": an interface name has no`},
	{"interface with a space", withInterface("'tap 0'"), `t.yaml:12: vm "web1": interface "tap 0": an interface name has no`},
	{"interface empty", withInterface(`""`), `t.yaml:12: vm "web1": interface: an interface name must not be empty`},
	{"interface dot-dot", withInterface(".."), `t.yaml:12: vm "web1": interface "..": not an interface name`},
	{"interface not a string", withInterface("[tap0]"), `t.yaml:12: vm interface must be a string`},
	{"two VMs on one interface of a host", func(s string) string {
		return withInterface("tap0")(s) + "  - {name: web2, host: h1, subnet: blue/web, interface: tap0}\n"
	}, `t.yaml:13: vm "web2": interface tap0 on host "h1" is vm "web1"'s already (line 9)`},
	{"an interface named like another VM's default vif", func(s string) string {
		return s + "  - {name: web2, host: h1, subnet: blue/web, interface: " + intent.VifName("blue", "web1") + "}\n"
	}, `t.yaml:12: vm "web2": interface ` + intent.VifName("blue", "web1") + ` on host "h1" is vm "web1"'s already (line 9)`},
}

// withInterface gives web1 of good the interface line `interface: v`.
func withInterface(v string) func(string) string {
	return func(s string) string {
		return strings.Replace(s, "    subnet: blue/web\n", "    subnet: blue/web\n    interface: "+v+"\n", 1)
	}
}

// A VM may name its interface; one on another host may share the name, and
// a VM without one has the default, derived from its farm and name.
func TestAVMNamesItsInterface(t *testing.T) {
	src := withInterface("tap-web1")(good) + "  - {name: web2, host: h1, subnet: blue/web}\n" +
		"  - {name: web3, host: h2, subnet: blue/web, interface: tap-web1}\n"
	src = strings.Replace(src, "  - name: h1\n", "  - name: h1\n  - name: h2\n", 1)
	f, err := Parse("t.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ vm, want string }{{"web1", "tap-web1"}, {"web2", intent.VifName("blue", "web2")}, {"web3", "tap-web1"}} {
		if v, _ := f.VMByNode(c.vm); v.Vif() != c.want {
			t.Errorf("%s's interface %q, want %q", c.vm, v.Vif(), c.want)
		}
	}
}

// twoFarms has blue/web1 and red/web1 on one host, and blue/web2 whose
// name no other farm has.
const sameNames = `name: t
hosts:
  - name: h1
farms:
  - name: blue
    subnets:
      - name: web
  - name: red
    subnets:
      - name: web
vms:
  - {name: web1, host: h1, subnet: blue/web}
  - {name: web1, host: h1, subnet: red/web}
  - {name: web2, host: h1, subnet: blue/web}
`

// Names are the tenant's: two farms may each have a web1, on one host;
// each is its own lab node (FARM/VM, the bare name being either) with its
// own default interface, and a name no other farm has stays the node.
func TestTwoFarmsMayNameAVMAlike(t *testing.T) {
	f, err := Parse("t.yaml", []byte(sameNames))
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []string{"blue/web1", "red/web1", "web2"} {
		if got := f.VMNode(f.VMs[i]); got != want {
			t.Errorf("vm %d (%s/%s): node %q, want %q", i, f.VMs[i].Farm(), f.VMs[i].Name, got, want)
		}
		if v, ok := f.VMByNode(want); !ok || v.Line != f.VMs[i].Line {
			t.Errorf("VMByNode(%q) = %+v, %v; want the VM of line %d", want, v, ok, f.VMs[i].Line)
		}
	}
	if v, ok := f.VMByNode("web1"); ok {
		t.Errorf("VMByNode(web1) = %s/%s: the bare name is both farms' VMs, no node", v.Farm(), v.Name)
	}
	if a, b := f.VMs[0].Vif(), f.VMs[1].Vif(); a == b {
		t.Errorf("blue/web1 and red/web1 on h1 share the interface %s", a)
	}
	if v, ok := f.VMOf("red", "web", "web1"); !ok || v.Farm() != "red" {
		t.Errorf("VMOf(red, web, web1) = %+v, %v", v, ok)
	}
	// blue/web1 to red/web1 is traffic between two VMs, not a VM's to
	// itself: a TAP policy may watch it.
	src := strings.Replace(sameNames, "      - name: web\n  - name: red\n", "      - name: web\n    peers: [red]\n  - name: red\n    peers: [blue]\n", 1) +
		"taps:\n  - {name: t1, sender: blue/web/web1, receiver: red/web/web1, monitor: blue/web/web2, cross_farm: true}\n"
	if _, err := Parse("t.yaml", []byte(src)); err != nil {
		t.Errorf("a TAP policy from blue/web1 to red/web1: %v", err)
	}
	// The same name twice in one farm is refused, in another subnet too.
	dup := strings.Replace(sameNames, "  - name: red\n", "      - name: db\n  - name: red\n", 1) + "  - {name: web1, host: h1, subnet: blue/db}\n"
	if _, err := Parse("t.yaml", []byte(dup)); err == nil || !strings.Contains(err.Error(), `duplicate vm "web1" in farm "blue" (first defined on line 13`) {
		t.Errorf("blue/db/web1 beside blue/web/web1: %v", err)
	}
}

func TestTopologyErrorsNameLineAndReason(t *testing.T) {
	for _, c := range errorCases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse("t.yaml", []byte(c.edit(good)))
			if err == nil {
				t.Fatalf("accepted; want error containing %q", c.wantErr)
			}
			if !strings.Contains(err.Error(), c.wantErr) {
				t.Fatalf("error %q does not contain %q", err, c.wantErr)
			}
		})
	}
}

func TestGoodTopologyParses(t *testing.T) {
	f, err := Parse("t.yaml", []byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if f.VMs[0].Farm() != "blue" || f.VMs[0].SubnetName() != "web" || f.VMs[0].Line != 9 {
		t.Fatalf("vm parsed as %+v", f.VMs[0])
	}
}

func TestLoadMissingFileSaysSo(t *testing.T) {
	_, err := Load(os.DevNull + "/nope.yaml")
	if err == nil || !strings.Contains(err.Error(), "read topology") {
		t.Fatalf("err = %v", err)
	}
}

const twoFarms = `name: t
hosts: [{name: h1}]
farms:
  - name: blue
    subnets: [{name: web}, {name: db}]
    peers: [red]
    rules:
      - {from: web, to: db, proto: tcp, port: 5432}
      - {from: web, to: red/web, proto: icmp}
  - name: red
    subnets: [{name: web}]
vms: []
`

func TestRulesAndPeersParseAndQualify(t *testing.T) {
	f, err := Parse("t.yaml", []byte(twoFarms))
	if err != nil {
		t.Fatal(err)
	}
	blue := f.Farms[0]
	if len(blue.Rules) != 2 || blue.Rules[0].Port != 5432 || blue.Peers[0] != "red" {
		t.Fatalf("blue %+v", blue)
	}
	if blue.Qualify(blue.Rules[0].To) != "blue/db" || blue.Qualify(blue.Rules[1].To) != "red/web" {
		t.Fatalf("qualify %s %s", blue.Qualify(blue.Rules[0].To), blue.Qualify(blue.Rules[1].To))
	}
}

// badRuleCases are edits of twoFarms that must be refused.
var badRuleCases = []struct{ old, new, want string }{
	{"to: db, proto: tcp", "to: dbx, proto: tcp", `t.yaml:8: rule of farm "blue": to "dbx" is not a subnet`},
	{"port: 5432", "port: 70000", `t.yaml:8: rule port "70000" is not a port number`},
	{"proto: tcp, port", "proto: sctp, port", `proto "sctp" is not tcp, udp, icmp or any`},
	{"proto: icmp", "proto: icmp, port: 7", "a port needs proto tcp or udp"},
	{"to: db, proto", "to: web, proto", "from and to are the same subnet"},
	{"peers: [red]", "peers: [green]", `farm "blue" peers with "green", which is not another farm`},
}

func TestBadRulesAreRejectedWithTheirLine(t *testing.T) {
	for _, c := range badRuleCases {
		t.Run(c.want, func(t *testing.T) {
			_, err := Parse("t.yaml", []byte(strings.Replace(twoFarms, c.old, c.new, 1)))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want %q", err, c.want)
			}
		})
	}
}

func TestVMFirewallParsesAndBadRulesAreRejected(t *testing.T) {
	base := strings.Replace(good, "    subnet: blue/web\n", `    subnet: blue/web
    firewall:
      default_in: deny
      rules:
        - {dir: in, proto: tcp, port: "8000-8080", cidr: 10.1.2.0/24, action: allow}
`, 1)
	f, err := Parse("t.yaml", []byte(base))
	if err != nil {
		t.Fatal(err)
	}
	fw := f.VMs[0].Firewall
	if fw == nil || fw.DefaultIn != "deny" || fw.DefaultOut != "allow" || fw.Rules[0].PortLo != 8000 || fw.Rules[0].PortHi != 8080 {
		t.Fatalf("firewall %+v", fw)
	}
	cases := []struct{ old, new, want string }{
		{"dir: in", "dir: sideways", `dir "sideways": want in or out`},
		{"action: allow", "action: maybe", `action "maybe": want allow or deny`},
		{`port: "8000-8080"`, `port: "9000-8000"`, `ports "9000-8000": the range ends below its start`},
		{"proto: tcp", "proto: icmp", "ports need proto tcp or udp"},
		{"cidr: 10.1.2.0/24", "cidr: 10.1.2.0/40", `cidr "10.1.2.0/40" is not an IPv4 prefix`},
		{"default_in: deny", "default_in: open", `default_in "open"`},
	}
	for _, c := range cases {
		t.Run(c.want, func(t *testing.T) {
			_, err := Parse("t.yaml", []byte(strings.Replace(base, c.old, c.new, 1)))
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "t.yaml:") {
				t.Fatalf("err = %v, want %q with a line", err, c.want)
			}
		})
	}
}

// duplicateKeyCases repeat a key somewhere in a topology.
var duplicateKeyCases = []struct {
	name, topo, want string
}{
	{"vm key", strings.Replace(good, "    host: h1\n", "    host: h1\n    host: h2\n", 1),
		`t.yaml:11: duplicate key "host" in vm (first on line 10, again on line 11)`},
	{"top-level section", good + "hosts:\n  - name: h2\n",
		`t.yaml:12: duplicate key "hosts" in topology (first on line 2, again on line 12)`},
	{"top-level scalar", "name: a\n" + strings.Replace(good, "name: t\n", "name: t\n", 1),
		`t.yaml:2: duplicate key "name" in topology (first on line 1, again on line 2)`},
	{"flow mapping", strings.Replace(good, "  - name: h1\n", "  - {name: h1, name: h2}\n", 1),
		`t.yaml:3: duplicate key "name" in host (first on line 3, again on line 3)`},
	{"fabric", good + "fabric:\n  cidr: 192.168.100.0/24\n  cidr: 192.168.200.0/24\n",
		`t.yaml:14: duplicate key "cidr" in fabric (first on line 13, again on line 14)`},
	{"firewall rule", strings.Replace(good, "    subnet: blue/web\n", `    subnet: blue/web
    firewall:
      rules:
        - {dir: in, action: allow, action: deny}
`, 1), `t.yaml:14: duplicate key "action" in firewall rule (first on line 14, again on line 14)`},
}

func TestDuplicateKeysAreRefusedWithTheLinesOfBoth(t *testing.T) {
	for _, c := range duplicateKeyCases {
		t.Run(c.name, func(t *testing.T) {
			f, err := Parse("t.yaml", []byte(c.topo))
			if err == nil {
				t.Fatalf("accepted (last one wins: %+v); want %q", f, c.want)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q does not contain %q", err, c.want)
			}
		})
	}
}

// malformedCases are files that are not a topology at all.
var malformedCases = map[string]string{
	"empty":            "",
	"only a comment":   "# nothing\n",
	"not a mapping":    "- a\n- b\n",
	"two documents":    good + "---\nname: u\n",
	"bad second doc":   good + "---\n[\n",
	"unclosed flow":    "hosts: [\n",
	"tab indentation":  "hosts:\n\t- name: h1\n",
	"not utf-8":        "name: t\nhosts: [{name: \xff}]\n",
	"control char":     "name: t\x01\n",
	"alias as a value": "name: &a t\nhosts: [{name: *a}]\n",
	"merge key":        "x: &a {name: h1}\nhosts: [{<<: *a}]\n",
	"null value":       "hosts:\n",
	"key not a scalar": "? [a]\n: b\n",
}

func TestEveryParseErrorNamesALine(t *testing.T) {
	for name, topo := range malformedCases {
		t.Run(name, func(t *testing.T) {
			_, err := Parse("t.yaml", []byte(topo))
			if err == nil {
				t.Fatal("accepted")
			}
			checkErrorLines(t, err)
		})
	}
}

// errLineRE is how every line of a topology error starts.
var errLineRE = regexp.MustCompile(`^t\.yaml:[1-9][0-9]*: \S`)

func checkErrorLines(t *testing.T, err error) {
	t.Helper()
	for _, line := range strings.Split(err.Error(), "\n") {
		if !errLineRE.MatchString(line) {
			t.Fatalf("error line %q does not start with t.yaml:LINE:\nwhole error: %v", line, err)
		}
	}
}

// TestANewNodeKindIsItsOwnSection adds a kind the way a feature will: a
// section of its own, registered with one line, keeping its entries in
// File.extra, its names in the same space as every other node's.
func TestANewNodeKindIsItsOwnSection(t *testing.T) {
	type router struct {
		Name string
		Line int
	}
	routers := section{
		key: "routers",
		decode: func(d *decoder, v *yaml.Node, f *File) {
			var rs []router
			d.report(d.seq("routers", func(item *yaml.Node) {
				r := router{Line: item.Line}
				d.mapping(item, "router", map[string]field{"name": d.str(&r.Name, "router name")})
				rs = append(rs, r)
			})(v))
			setExtra(f, "routers", rs)
		},
		validate: func(c *checker, f *File) {
			for _, r := range extra[[]router](f, "routers") {
				if holder, ok := c.claimNode("router", r.Name, r.Line); !ok {
					c.fail(r.Line, "router name %q is already the %s of line %d", r.Name, holder.kind, holder.line)
				}
			}
		},
	}
	saved := sections
	sections = append(append([]section(nil), sections...), routers)
	t.Cleanup(func() { sections = saved })

	f, err := Parse("t.yaml", []byte(good+"routers: [{name: wan1}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if rs := extra[[]router](f, "routers"); len(rs) != 1 || rs[0].Name != "wan1" || rs[0].Line != 12 {
		t.Fatalf("routers %+v", rs)
	}
	_, err = Parse("t.yaml", []byte(good+"routers: [{name: h1, color: red}]\n"))
	if err == nil || !strings.Contains(err.Error(), `t.yaml:12: unknown key "color" in router`) {
		t.Fatalf("err = %v", err)
	}
	_, err = Parse("t.yaml", []byte(good+"routers: [{name: h1}]\n"))
	if err == nil || !strings.Contains(err.Error(), `t.yaml:12: router name "h1" is already the host of line 3`) {
		t.Fatalf("err = %v", err)
	}
	if f, _ := Parse("t.yaml", []byte(good)); extra[[]router](f, "routers") != nil {
		t.Fatal("a file without the key has routers")
	}
}
