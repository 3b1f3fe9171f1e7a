package lab

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/vishvananda/netlink"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/netns"
	"github.com/onehop/onehop/internal/topology"
)

// Multipath cloud access (issue 11): what the kinds wan, gateway, user,
// xtr and server share. The controller is the LISP map-server and
// map-resolver on the fabric (UDP 4342), with a site-keys file the lab
// makes: one site per gateway and per xTR, each with its own random secret
// and key id, which only that node's daemon is given.

// Interface names of the cloud-access nodes.
const (
	cloudMgmt      = "mgmt0" // a gateway's or an xTR's NIC on the fabric
	wanGatewaySide = "gw0"   // a WAN router's link to its gateway
	wanXTRSide     = "dc0"   // a WAN router's link to its xTR
	cloudNIC       = "eth0"  // a user's or a server's only link
	lispPort       = 4342
)

// CloudNode is what lab status shows of a cloud-access node besides its
// interfaces: its role's addresses (a gateway's path EIDs live on lo,
// which the interface list leaves out).
type CloudNode struct {
	// EIDPrefix is a gateway's or an xTR's EID prefix.
	EIDPrefix string `json:"eidPrefix,omitempty"`
	// Paths are a gateway's or an xTR's WANs: its RLOC on each and, for a
	// gateway, the EID its subflows on that path come from.
	Paths []CloudPath `json:"paths,omitempty"`
	// Rate is a WAN's shaping ("" unshaped); Ends its gateway and xTR.
	Rate string   `json:"rate,omitempty"`
	Ends []string `json:"ends,omitempty"`
	// MapServer is the map-server a gateway or xTR uses.
	MapServer string `json:"mapServer,omitempty"`
	// Via is a user's gateway or a server's xTR.
	Via string `json:"via,omitempty"`
}

// CloudPath is one WAN of a gateway or an xTR.
type CloudPath struct {
	WAN  string `json:"wan"`
	RLOC string `json:"rloc"`
	EID  string `json:"eid,omitempty"`
}

// setCloud records what status shows of node.
func (b *builder) setCloud(node string, c *CloudNode) error {
	if b.st.Cloud == nil {
		b.st.Cloud = map[string]*CloudNode{}
	}
	b.st.Cloud[node] = c
	return b.st.save()
}

// mapServer is the controller's LISP address.
func mapServer(t *topology.File) string {
	return net.JoinHostPort(t.Fabric.Controller, fmt.Sprint(lispPort))
}

// lispSites is the controller's site-keys file.
func lispSites(st *State) string { return filepath.Join(st.Dir, "lisp-sites") }

// lispKeyFile is node's own secret.
func lispKeyFile(st *State, node string) string { return filepath.Join(st.Dir, "lisp-key-"+node) }

// cloudSites are the map-server's sites, one per gateway then per xTR, key
// ids from 1 in that order.
func cloudSites(t *topology.File) (names, prefixes []string) {
	for _, g := range t.Gateways() {
		names, prefixes = append(names, g.Name), append(prefixes, g.EIDPrefix)
	}
	for _, x := range t.XTRs() {
		names, prefixes = append(names, x.Name), append(prefixes, x.EIDPrefix)
	}
	return names, prefixes
}

// keyIDOf is node's key id in the site-keys file.
func keyIDOf(t *topology.File, node string) int {
	names, _ := cloudSites(t)
	for i, n := range names {
		if n == node {
			return i + 1
		}
	}
	return 0
}

// cloudControllerArgs makes the site-keys file and every site's key file
// and returns the controller's map-server flags, for a lab with
// cloud-access nodes (none otherwise).
func cloudControllerArgs(b *builder) ([]string, error) {
	if !b.t.CloudAccess() {
		return nil, nil
	}
	names, prefixes := cloudSites(b.t)
	var sites strings.Builder
	sites.WriteString("# LISP sites (NAME KEY-ID SECRET EID-PREFIX), made by onehop lab up\n")
	for i, n := range names {
		var raw [16]byte
		if _, err := rand.Read(raw[:]); err != nil {
			return nil, err
		}
		key := hex.EncodeToString(raw[:])
		fmt.Fprintf(&sites, "%s %d %s %s\n", n, i+1, key, prefixes[i])
		if err := os.WriteFile(lispKeyFile(b.st, n), []byte(key+"\n"), 0o600); err != nil {
			return nil, fmt.Errorf("lisp key of %s: %w", n, err)
		}
	}
	if err := os.WriteFile(lispSites(b.st), []byte(sites.String()), 0o600); err != nil {
		return nil, fmt.Errorf("lisp site keys: %w", err)
	}
	b.step("controller: LISP map-server and map-resolver on %s, %d sites (keys in %s)", mapServer(b.t), len(names), lispSites(b.st))
	return []string{"--lisp-listen", mapServer(b.t), "--lisp-site-keys", lispSites(b.st)}, nil
}

// vethBetween links namespace a (end aName, address aAddr) to namespace z
// (end zName, address zAddr); an address may be invalid (none). Both ends
// come up.
func vethBetween(a, aName string, aAddr netip.Prefix, z, zName string, zAddr netip.Prefix) error {
	ah, err := netns.Handle(a)
	if err != nil {
		return err
	}
	defer ah.Close()
	zfd, err := netns.Fd(z)
	if err != nil {
		return err
	}
	defer zfd.Close()
	v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: aName}, PeerName: zName, PeerNamespace: netlink.NsFd(int(zfd))}
	if err := ah.LinkAdd(v); err != nil {
		return fmt.Errorf("create %s (%s) <-> %s (%s): %w", aName, a, zName, z, err)
	}
	for _, end := range []struct {
		ns, name string
		addr     netip.Prefix
	}{{a, aName, aAddr}, {z, zName, zAddr}} {
		h, err := netns.Handle(end.ns)
		if err != nil {
			return err
		}
		l, err := h.LinkByName(end.name)
		if err == nil && end.addr.IsValid() {
			err = h.AddrAdd(l, &netlink.Addr{IPNet: prefixNet(end.addr)})
		}
		if err == nil {
			err = h.LinkSetUp(l)
		}
		h.Close()
		if err != nil {
			return fmt.Errorf("%s in %s: %w", end.name, end.ns, err)
		}
	}
	return nil
}

// routeVia adds dst via gw (on dev) in namespace ns; an invalid gw makes
// it a link route on dev.
func routeVia(ns string, dst netip.Prefix, gw netip.Addr, dev string) error {
	h, err := netns.Handle(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	l, err := h.LinkByName(dev)
	if err != nil {
		return fmt.Errorf("%s in %s: %w", dev, ns, err)
	}
	r := &netlink.Route{LinkIndex: l.Attrs().Index, Dst: prefixNet(dst)}
	if gw.IsValid() {
		r.Gw = gw.AsSlice()
	} else {
		r.Scope = netlink.SCOPE_LINK
	}
	if err := h.RouteAdd(r); err != nil {
		return fmt.Errorf("route %s via %s dev %s in %s: %w", dst, gw, dev, ns, err)
	}
	return nil
}

func prefixNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), 32)}
}

// run runs a command (ip, tc) and names it in its error.
func runCmd(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// lispRegistered reports whether the map-server holds a registration of
// prefix (what a gateway's or an xTR's daemon does first).
func (b *builder) lispRegistered(ctx context.Context, prefix netip.Prefix) (bool, error) {
	s, err := b.store()
	if err != nil {
		return false, nil // not up yet: ask again
	}
	_, err = s.Get(ctx, intent.LISPMappingKey(prefix))
	return err == nil, nil
}
