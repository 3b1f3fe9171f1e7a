package cni

import (
	"encoding/json"
	"fmt"
	"net/netip"

	"github.com/onehop/onehop/internal/addrplan"
	"github.com/onehop/onehop/internal/intent"
)

// Result is a command's result (the spec's "Success" object).
type Result struct {
	CNIVersion string      `json:"cniVersion"`
	Interfaces []Interface `json:"interfaces,omitempty"`
	IPs        []IPConfig  `json:"ips,omitempty"`
	Routes     []Route     `json:"routes,omitempty"`
	DNS        *DNS        `json:"dns,omitempty"`
}

// Interface is one interface the plugin made; Sandbox is the namespace of
// one inside the container ("" on the host).
type Interface struct {
	Name    string `json:"name"`
	MAC     string `json:"mac,omitempty"`
	Sandbox string `json:"sandbox,omitempty"`
}

// IPConfig is an address on Interfaces[*Interface]. Version is "4" before
// spec 1.0.0, absent since.
type IPConfig struct {
	Version   string `json:"version,omitempty"`
	Interface *int   `json:"interface,omitempty"`
	Address   string `json:"address"`
	Gateway   string `json:"gateway,omitempty"`
}

// Route is a route the container got.
type Route struct {
	Dst string `json:"dst"`
	GW  string `json:"gw,omitempty"`
}

// DNS is the resolver configuration of the spec.
type DNS struct {
	Nameservers []string `json:"nameservers,omitempty"`
	Domain      string   `json:"domain,omitempty"`
	Search      []string `json:"search,omitempty"`
	Options     []string `json:"options,omitempty"`
}

// Prefix is a VM's address with its subnet's length in the cloud's plan
// (a /24 in the default 10.f.s.h).
func Prefix(vm intent.VM) (netip.Prefix, error) {
	ip, err := netip.ParseAddr(vm.IP)
	if err != nil || !ip.Is4() {
		return netip.Prefix{}, fmt.Errorf("vm %s: address %q is not IPv4", vm.FullName(), vm.IP)
	}
	return netip.PrefixFrom(ip, addrplan.Current().SubnetBitsLen()), nil
}

// BuildResult is ADD's result for vm, behind the host interface (with
// its MAC) and the container's ifname in netns, after the results of the
// plugins before (prev, may be nil) in the config's version.
func BuildResult(c NetConf, prev *Result, vm intent.VM, hostMAC, ifname, netns string) (Result, error) {
	p, err := Prefix(vm)
	if err != nil {
		return Result{}, err
	}
	r := Result{CNIVersion: c.CNIVersion}
	if prev != nil {
		r.Interfaces = append(r.Interfaces, prev.Interfaces...)
		r.IPs = append(r.IPs, prev.IPs...)
		r.Routes = append(r.Routes, prev.Routes...)
		r.DNS = prev.DNS
	}
	idx := len(r.Interfaces) + 1
	r.Interfaces = append(r.Interfaces,
		Interface{Name: vm.Interface, MAC: hostMAC},
		Interface{Name: ifname, MAC: vm.MAC, Sandbox: netns})
	ipc := IPConfig{Interface: &idx, Address: p.String(), Gateway: vm.Gateway}
	r.Routes = append(r.Routes, Route{Dst: "0.0.0.0/0", GW: vm.Gateway})
	r.IPs = append(r.IPs, ipc)
	if c.DNS != nil {
		r.DNS = c.DNS
	}
	for i := range r.IPs {
		if atLeast(c.CNIVersion, "1.0.0") {
			r.IPs[i].Version = ""
		} else {
			r.IPs[i].Version = "4"
		}
	}
	return r, nil
}

// parsePrev reads a prevResult (nil when there is none).
func parsePrev(raw json.RawMessage) (*Result, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var r Result
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, &Error{Code: ErrDecodingFailure, Msg: "network config: prevResult is not a CNI result", Details: err.Error()}
	}
	return &r, nil
}

// checkPrev checks that the ADD's result being checked (prev) has what
// the plugin gave: ifname in netns with the VM's MAC, and its address.
func checkPrev(prev *Result, vm intent.VM, ifname, netns string) error {
	if prev == nil {
		return errorf(ErrInvalidConfig, "CHECK: network config has no prevResult (the ADD's result to check)")
	}
	p, err := Prefix(vm)
	if err != nil {
		return err
	}
	for i, in := range prev.Interfaces {
		if in.Name != ifname || in.Sandbox != netns {
			continue
		}
		if in.MAC != vm.MAC {
			return errorf(ErrCheckFailed, "CHECK: prevResult gives %s the MAC %s; vm %s has %s", ifname, in.MAC, vm.FullName(), vm.MAC)
		}
		for _, ipc := range prev.IPs {
			if ipc.Interface != nil && *ipc.Interface == i && ipc.Address == p.String() {
				return nil
			}
		}
		return errorf(ErrCheckFailed, "CHECK: prevResult has no address %s on %s (vm %s's)", p, ifname, vm.FullName())
	}
	return errorf(ErrCheckFailed, "CHECK: prevResult has no interface %s in %s", ifname, netns)
}
