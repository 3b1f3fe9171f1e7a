package datapath

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sort"

	"github.com/onehop/onehop/internal/intent"
)

// CompileHosts turns the store's node records into the hosts map: the
// uplink MACs the datapath hears tenant traffic and ARP from (bpf/lib/
// fabric_trust.h). self, this host, is left out: a frame from the fabric with
// this host's own MAC is forged. A record whose MAC does not parse is left
// out too and named in the error; the others are still returned, so one
// broken record does not cut this host off from the rest.
func CompileHosts(nodes []intent.Node, self string) (map[HostKey]uint8, error) {
	hosts := map[HostKey]uint8{}
	var bad []string
	for _, n := range nodes {
		if n.Name == self {
			continue
		}
		mac, err := net.ParseMAC(n.UplinkMAC)
		if err != nil || len(mac) != 6 {
			bad = append(bad, fmt.Sprintf("node %s: uplink MAC %q is not an Ethernet address", n.Name, n.UplinkMAC))
			continue
		}
		hosts[hostKey(mac)] = 1
	}
	if len(bad) > 0 {
		sort.Strings(bad)
		return hosts, fmt.Errorf("node records left out of the known hosts: %v", bad)
	}
	return hosts, nil
}

func hostKey(mac net.HardwareAddr) HostKey {
	var k HostKey
	copy(k.Mac[:], mac)
	return k
}

// syncHosts writes the known hosts and, when one left, forgets the mapping
// entries that point at it: the datapath believes a frame whose source
// matches its entry without asking `hosts` again, so no entry may outlive
// its host's record.
func (k *Kernel) syncHosts(want map[HostKey]uint8) error {
	changed := false
	if err := syncMap(k.vif.Hosts, want, "hosts", &changed); err != nil || !changed {
		return err
	}
	var stale []uint32
	var ip uint32
	var m Mapping
	it := k.vif.Mappings.Iterate()
	for it.Next(&ip, &m) {
		if m.HostMac == [6]byte{} {
			continue // being asked for
		}
		if _, ok := want[HostKey{Mac: m.HostMac}]; !ok {
			stale = append(stale, ip)
		}
	}
	errs := []error{it.Err()}
	for _, ip := range stale {
		errs = append(errs, k.ForgetMapping(KeyIP(ip)))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("forget mappings of hosts that left: %w", err)
	}
	return nil
}

// PointMapping makes host the holder of ip in the mapping table, as
// confirmed now: the agent's answer to a host's claim the store agreed
// with. It keeps the entry's use time, so a VM in use stays in use.
func (k *Kernel) PointMapping(ip netip.Addr, host net.HardwareAddr, now uint64) error {
	if !ip.Is4() || len(host) != 6 {
		return fmt.Errorf("point mapping %s at %s: not an IPv4 address and an Ethernet MAC", ip, host)
	}
	var m Mapping
	if err := k.vif.Mappings.Lookup(IPKey(ip), &m); err != nil {
		m = Mapping{UsedNs: now}
	}
	copy(m.HostMac[:], host)
	m.ConfirmedNs = now
	m.Held = 0
	if err := k.vif.Mappings.Put(IPKey(ip), m); err != nil {
		return fmt.Errorf("point mapping %s at %s: %w", ip, host, err)
	}
	return nil
}
