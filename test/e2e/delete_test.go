package e2e

import (
	endian "encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/onehop/onehop/internal/datapath"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/lab"
	"github.com/onehop/onehop/internal/testenv"
)

// pinnedMap opens one of host's pinned datapath maps (the agent's, under
// the lab's bpffs), closed when the test ends.
func (l *testLab) pinnedMap(host, name string) *ebpf.Map {
	l.t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(testRoot, l.name, "bpffs", host, "maps", name), nil)
	if err != nil {
		l.t.Fatalf("%s's pinned map %s: %v", host, name, err)
	}
	l.t.Cleanup(func() { m.Close() })
	return m
}

// farmEntries lists, map by map, the entries of farm id in host's
// reconciled maps: its VMs' endpoints and vifs (by address), its scopes
// and scope members (by farm byte), the visibility rules from or to it,
// and its switches (farms[id] set); and in the mapping table the datapath
// learns, its VMs' addresses. What a farm's delete must leave none of.
func (l *testLab) farmEntries(host string, id uint16) []string {
	l.t.Helper()
	var out []string
	each := func(name string, of func(k, v []byte) bool) {
		m := l.pinnedMap(host, name)
		k, v := make([]byte, m.KeySize()), make([]byte, m.ValueSize())
		it := m.Iterate()
		for it.Next(k, v) {
			if of(k, v) {
				out = append(out, fmt.Sprintf("%s %x=%x", name, k, v))
			}
		}
		if err := it.Err(); err != nil {
			l.t.Fatalf("%s's map %s: %v", host, name, err)
		}
	}
	isFarm := func(ip []byte) bool { return ip[0] == 10 && uint16(ip[1]) == id }
	// Farm ids in the scope and visibility keys are 16-bit (addrplan).
	at := func(k []byte, off int) uint16 { return endian.NativeEndian.Uint16(k[off:]) }
	each("endpoints", func(k, _ []byte) bool { return isFarm(k) })
	each("mappings", func(k, _ []byte) bool { return isFarm(k) })
	each("vifs", func(_, v []byte) bool { return isFarm(v) })
	each("scopes", func(k, _ []byte) bool { return at(k, 0) == id })
	each("scope_members", func(k, _ []byte) bool { return at(k, 0) == id })
	each("visibility", func(k, _ []byte) bool { return at(k, 0) == id || at(k, 4) == id })
	each("farms", func(k, v []byte) bool {
		return endian.NativeEndian.Uint32(k) == uint32(id) && endian.NativeEndian.Uint32(v) != 0
	})
	return out
}

// etcdKeys is `etcdctl get --prefix /onehop/` on the lab's etcd: every key
// with its value.
func (l *testLab) etcdKeys() map[string]string {
	l.t.Helper()
	st, err := lab.Load(testRoot, l.name)
	if err != nil {
		l.t.Fatal(err)
	}
	cmd := exec.Command("etcdctl", "--endpoints=unix://"+st.EtcdSocket, "get", "--prefix", intent.Root, "-w", "json")
	cmd.Env = append(cmd.Environ(), "ETCDCTL_API=3")
	b, err := cmd.Output()
	if err != nil {
		l.t.Fatalf("etcdctl get --prefix %s: %v", intent.Root, err)
	}
	var r struct {
		KVs []struct {
			Key   []byte `json:"key"`
			Value []byte `json:"value"`
		} `json:"kvs"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		l.t.Fatalf("etcdctl's answer: %v\n%s", err, b)
	}
	out := map[string]string{}
	for _, kv := range r.KVs {
		out[string(kv.Key)] = string(kv.Value)
	}
	if len(out) == 0 {
		l.t.Fatal("etcdctl found no key at all: not the lab's etcd")
	}
	return out
}

const twoFarmsLab = `name: %s
hosts: [{name: h1}, {name: h2}]
farms:
  - name: blue
    proxy_arp: true
    subnets: [{name: web}, {name: db}]
    rules: [{from: web, to: db}]
    peers: [red]
  - name: red
    subnets: [{name: web}]
    rules: [{from: web, to: blue/db}]
    peers: [blue]
vms:
  - {name: web1, host: h1, subnet: blue/web}
  - {name: db1, host: h2, subnet: blue/db}
  - {name: r1, host: h1, subnet: red/web}
  - {name: r2, host: h2, subnet: red/web}
`

// TestPrivilegedFarmCascadeDeleteLeavesNoKeyAndNoMapEntry: a farm with
// subnets, VMs on two hosts, a rule and a peering of another farm naming
// it is refused its delete (naming them), then cascade-deleted: etcd
// holds no key of it (etcdctl), no host's reconciled maps hold an entry
// of it (read from the pinned maps, which held them before), and the
// other farm's VMs still talk across the hosts.
func TestPrivilegedFarmCascadeDeleteLeavesNoKeyAndNoMapEntry(t *testing.T) {
	testenv.RequireTool(t, "etcdctl")
	l := upLab(t, twoFarmsLab)
	for _, p := range [][2]string{{"web1", "db1"}, {"r1", "r2"}} {
		if err := l.ping(p[0], l.ip(p[1]), 2); err != nil {
			t.Fatal(err)
		}
	}
	out, err := l.cli("farm", "get", "blue", "-o", "json")
	var blue intent.Farm
	if err != nil || json.Unmarshal([]byte(out), &blue) != nil || blue.ID == 0 {
		t.Fatalf("farm get blue: %v\n%s", err, out)
	}
	// The entries were there: each host carries a VM of blue, and has
	// learned where the other host's is (web1 pinged db1).
	for _, h := range []string{"h1", "h2"} {
		got := strings.Join(l.farmEntries(h, blue.ID), "\n")
		for _, m := range []string{"endpoints ", "mappings ", "vifs ", "scopes ", "scope_members ", "visibility ", "farms "} {
			if !strings.Contains(got, m) {
				t.Fatalf("before the delete, %s has no %sentry of blue (id %d): the check below would prove nothing\n%s", h, m, blue.ID, got)
			}
		}
	}

	out, err = l.cli("farm", "delete", "blue")
	for _, dep := range []string{"subnet blue/db", "subnet blue/web", "vm blue/web/web1", "vm blue/db/db1", "rule of farm red: red/web -> blue/db any", "peering of farm red", "--cascade"} {
		if err == nil || !strings.Contains(out, dep) {
			t.Fatalf("farm delete blue with dependants: %v, want a refusal naming %q\n%s", err, dep, out)
		}
	}
	if out, err := l.cli("farm", "delete", "blue", "--cascade"); err != nil || out != "farm blue deleted\n" {
		t.Fatalf("farm delete blue --cascade: %v\n%s", err, out)
	}

	// etcd: no key of blue, of its VMs or of its state; red's record
	// without its rule and peering naming blue. The audit trail keeps
	// the record that the delete happened (docs/tenants.md, "Deletes
	// leave history").
	keys := l.etcdKeys()
	for k, v := range keys {
		if strings.HasPrefix(k, intent.AuditPrefix) || strings.HasPrefix(k, intent.TenantCertRevocationsPrefix+"farm/") {
			continue // history, and blue's tenant certificates, which stay revoked
		}
		if strings.Contains(k, "blue") || strings.Contains(v, "blue") || strings.Contains(k, "web1") || strings.Contains(k, "db1") ||
			k == intent.FarmStateKey(blue.ID) || strings.Contains(v, fmt.Sprintf(`"10.%d.`, blue.ID)) {
			t.Errorf("etcd still holds %s = %s", k, v)
		}
	}
	if _, ok := keys[intent.FarmsPrefix+"red"]; !ok {
		t.Errorf("red's record went with blue: %v", slices.Sorted(maps.Keys(keys)))
	}
	// Every host's maps: nothing of blue, once its agent has reconciled.
	for _, h := range []string{"h1", "h2"} {
		testenv.Eventually(t, h+"'s datapath to hold no entry of blue", 10*time.Second, func() error {
			if left := l.farmEntries(h, blue.ID); len(left) > 0 {
				return fmt.Errorf("%s still holds:\n%s", h, strings.Join(left, "\n"))
			}
			return nil
		})
	}
	// red carries on across the hosts; blue's namespaces, which the
	// lab keeps, talk no more.
	if err := l.ping("r1", l.ip("r2"), 3); err != nil {
		t.Fatal(err)
	}
	if err := l.ping("web1", l.ip("db1"), 1); err == nil {
		t.Error("web1 still reaches db1 after blue's delete")
	}
}

// TestPrivilegedDeletedVMsAddressGoesToANewVMOnAnotherHostThatIsReachable:
// a container's VM (CNI) on h1 is deleted with `onehop vm delete`; h1's
// datapath drops its endpoint, and the next container's VM, on h2, gets
// the same address (`onehop vm get` says so) and is reached from a VM on
// h1, which never knew it somewhere else, and from one on h2. h2, which
// had learned the address on h1, forgets it within 2 seconds of the
// delete; h1 ends up mapping it to h2.
func TestPrivilegedDeletedVMsAddressGoesToANewVMOnAnotherHostThatIsReachable(t *testing.T) {
	testenv.RequireTool(t, "cnitool", "nsenter")
	l := upLab(t, qemuGuestLab) // web1 on h1, web2 on h2; the containers are the test's
	h1, h2 := newCNIHost(t, l, "h1", "blue"), newCNIHost(t, l, "h2", "blue")
	c1, c2 := newContainer(t, "c1"), newContainer(t, "c2")
	t.Cleanup(func() { h1.cnitool("del", c1.path); h2.cnitool("del", c2.path) })

	r1 := h1.add(t, c1)
	ip := strings.TrimSuffix(r1.IPs[0].Address, "/24")
	if out, err := l.cli("vm", "get", "blue/web/"+c1.vm); err != nil || !strings.Contains(out, "on h1: "+ip+",") {
		t.Fatalf("vm get %s: %v\n%s", c1.vm, err, out)
	}
	if err := l.ping("web2", ip, 2); err != nil {
		t.Fatal(err)
	}
	h2Table := l.pinnedMap("h2", "mappings")
	if got, want := l.mappingOf(h2Table, ip), l.mac("h1", "uplink0"); got != want {
		t.Fatalf("before the delete, h2 maps %s to %q, want h1 (%s)", ip, got, want)
	}
	endpoints := l.pinnedMap("h1", "endpoints")
	key := netip.MustParseAddr(ip).As4()
	v := make([]byte, endpoints.ValueSize())
	if err := endpoints.Lookup(key[:], v); err != nil {
		t.Fatalf("h1 holds no endpoint of %s before the delete: %v", ip, err)
	}

	if out, err := l.cli("vm", "delete", "blue/web/"+c1.vm); err != nil || out != "vm blue/web/"+c1.vm+" deleted\n" {
		t.Fatalf("vm delete %s: %v\n%s", c1.vm, err, out)
	}
	if out, err := l.cli("vm", "get", "blue/web/"+c1.vm); err == nil || !strings.Contains(out, "not found") {
		t.Fatalf("vm get after the delete: %v\n%s", err, out)
	}
	testenv.Eventually(t, "h1's datapath to drop "+ip, 10*time.Second, func() bool {
		return endpoints.Lookup(key[:], v) != nil
	})
	// h2, whose web2 talked to it, forgets where it was.
	testenv.Eventually(t, "h2 to hold no mapping of the deleted "+ip, 2*time.Second, func() bool {
		return l.mappingOf(h2Table, ip) == ""
	})
	// The runtime's DEL of a VM already gone succeeds and takes its links.
	if out, err := h1.cnitool("del", c1.path); err != nil {
		t.Fatalf("cnitool del c1 after its VM's delete: %v\n%s", err, out)
	}

	r2 := h2.add(t, c2)
	if got := strings.TrimSuffix(r2.IPs[0].Address, "/24"); got != ip {
		t.Fatalf("c2 got %s, want c1's freed %s", got, ip)
	}
	if out, err := l.cli("vm", "get", "blue/web/"+c2.vm); err != nil || !strings.Contains(out, "on h2: "+ip+",") {
		t.Fatalf("vm get %s: %v\n%s", c2.vm, err, out)
	}
	for _, from := range []string{"web1", "web2"} {
		if err := l.ping(from, ip, 3); err != nil {
			t.Error(err)
		}
	}
	// It is c2 that answers: it reaches web1 from that address itself.
	if err := c2.ping(l.ip("web1"), 3); err != nil {
		t.Error(err)
	}
	// h1 maps the address to c2's host, and keeps it.
	if got, want := l.mappingOf(l.pinnedMap("h1", "mappings"), ip), l.mac("h2", "uplink0"); got != want {
		t.Errorf("h1 maps the re-used %s to %q, want the new VM's host h2 (%s)", ip, got, want)
	}
}

// mappingOf is host's learned mapping of ip, read from its pinned mapping
// table: the MAC of the host it maps ip to, "" without an entry ("asking"
// for one that is only being asked for).
func (l *testLab) mappingOf(table *ebpf.Map, ip string) string {
	l.t.Helper()
	var m datapath.Mapping
	if err := table.Lookup(datapath.IPKey(netip.MustParseAddr(ip)), &m); errors.Is(err, ebpf.ErrKeyNotExist) {
		return ""
	} else if err != nil {
		l.t.Fatalf("mapping of %s: %v", ip, err)
	}
	if m.HostMac == [6]byte{} {
		return "asking"
	}
	return net.HardwareAddr(m.HostMac[:]).String()
}

// TestPrivilegedDeletedVMsLearnedMappingLeavesTheOtherHostWithinSeconds:
// web2 (h2) talks to web1 and web3 (h1), so h2's datapath has learned both
// on h1 (read from its pinned mapping table). web1 is deleted: h2's entry
// for it goes within 2 seconds, counted as purged on h2's /metrics, and
// web3's, a live VM on the same host, stays and carries traffic on.
func TestPrivilegedDeletedVMsLearnedMappingLeavesTheOtherHostWithinSeconds(t *testing.T) {
	l := upLab(t, quickstart) // web1 and web3 on h1, web2 on h2
	web1, web3 := l.ip("web1"), l.ip("web3")
	for _, to := range []string{web1, web3} {
		if err := l.ping("web2", to, 2); err != nil {
			t.Fatal(err)
		}
	}
	table := l.pinnedMap("h2", "mappings")
	h1 := l.mac("h1", "uplink0")
	for _, ip := range []string{web1, web3} {
		if got := l.mappingOf(table, ip); got != h1 {
			t.Fatalf("before the delete, h2 maps %s to %q, want h1 (%s): the check below would prove nothing", ip, got, h1)
		}
	}
	purged := l.metrics("h2").at(arpEvent("purged"))

	if out, err := l.cli("vm", "delete", "blue/web/web1"); err != nil || out != "vm blue/web/web1 deleted\n" {
		t.Fatalf("vm delete web1: %v\n%s", err, out)
	}
	t0 := time.Now()
	testenv.Eventually(t, "h2 to hold no mapping of web1 ("+web1+")", 2*time.Second, func() error {
		if got := l.mappingOf(table, web1); got != "" {
			return fmt.Errorf("h2 still maps %s to %s", web1, got)
		}
		return nil
	})
	t.Logf("h2's mapping of the deleted web1 went %v after the delete was answered", time.Since(t0).Round(time.Millisecond))
	if got := l.metrics("h2").at(arpEvent("purged")) - purged; got != 1 {
		t.Errorf("h2 counted %v mappings purged, want 1 (web1's)", got)
	}
	if got := l.mappingOf(table, web3); got != h1 {
		t.Errorf("after web1's delete, h2 maps web3 (%s) to %q, want h1 (%s): a live VM's entry went too", web3, got, h1)
	}
	if err := l.ping("web2", web3, 2); err != nil {
		t.Error(err)
	}
}
