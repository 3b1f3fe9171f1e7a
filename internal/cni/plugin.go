package cni

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"

	"github.com/onehop/onehop/internal/intent"
)

// Controller is what the plugin asks of the controller's API.
type Controller interface {
	// CreateVM records name in farm/subnet on host, carried by iface, for
	// the attachment container.
	CreateVM(ctx context.Context, farm, subnet, name, host, iface string, container intent.VMContainer) (intent.VM, error)
	// VMs are farm's VMs.
	VMs(ctx context.Context, farm string) ([]intent.VM, error)
	// DeleteVM removes it; ErrNoVM when it is not there.
	DeleteVM(ctx context.Context, farm, subnet, name string) error
	// VM is farm/subnet/name's record; ErrNoVM when there is none.
	VM(ctx context.Context, farm, subnet, name string) (intent.VM, error)
	// Where says which of farm, subnet/of farm and host the controller
	// does not know: it names what an ADD's error should.
	Where(ctx context.Context, farm, subnet, host string) (missing string, err error)
}

// ErrNoVM is a VM the controller does not have.
var ErrNoVM = errors.New("no such vm")

// LinkSpec is the container's link: a veth whose host end (HostIf) is left
// down for the agent to bring up once attached, and whose other end is
// IfName in Netns with the VM's MAC, address and default route.
type LinkSpec struct {
	HostIf  string
	Netns   string
	IfName  string
	MAC     string
	Address netip.Prefix
	Gateway netip.Addr
}

// LinkState is what Links found of a container's link.
type LinkState struct {
	HostKind string // "" when there is no host end
	HostUp   bool   // the agent has attached and brought it up
	// PeerFound: IfName exists in the container's namespace and is the
	// host end's peer.
	PeerFound bool
	PeerMAC   string
	Addrs     []netip.Prefix // IPv4 addresses on the peer
	Gateway   netip.Addr     // the default route's gateway, if any
}

// Links makes, reads and removes container links (internal/cnilink).
type Links interface {
	// NetnsExists reports whether the namespace at path is there.
	NetnsExists(path string) bool
	// Add makes s's link and returns the host end's MAC.
	Add(s LinkSpec) (hostMAC string, err error)
	// WaitUp returns once hostIf is up (the agent attached to it) and
	// ifname in netns, its peer, can send (operationally up), or ctx's
	// error.
	WaitUp(ctx context.Context, hostIf, netns, ifname string) error
	// Delete removes hostIf, and ifname in netns if it is still there;
	// what is already gone is no error, netns may be "" or gone.
	Delete(hostIf, netns, ifname string) error
	// Inspect reads what there is of the link.
	Inspect(hostIf, netns, ifname string) (LinkState, error)
}

// Plugin runs the commands. NewController makes the API client of a
// config (whose files are read only then).
type Plugin struct {
	NewController func(NetConf) (Controller, error)
	Links         Links
	Hostname      func() (string, error)
}

// Run runs the command the environment names on the config read from
// stdin, writes the result or the error object to stdout and returns the
// exit status.
func (p *Plugin) Run(ctx context.Context, getenv func(string) string, stdin io.Reader, stdout io.Writer) int {
	version := Version
	out, err := p.run(ctx, getenv, stdin, &version)
	if err != nil {
		writeError(stdout, version, asError(err, ErrIOFailure))
		return 1
	}
	if out != nil {
		b, err := json.MarshalIndent(out, "", "  ")
		if err != nil {
			writeError(stdout, version, asError(err, ErrIOFailure))
			return 1
		}
		stdout.Write(append(b, '\n'))
	}
	return 0
}

// versionInfo is VERSION's answer.
type versionInfo struct {
	CNIVersion        string   `json:"cniVersion"`
	SupportedVersions []string `json:"supportedVersions"`
}

func (p *Plugin) run(ctx context.Context, getenv func(string) string, stdin io.Reader, version *string) (any, error) {
	env, err := ParseEnv(getenv)
	if err != nil {
		return nil, err
	}
	b, err := io.ReadAll(io.LimitReader(stdin, 1<<20))
	if err != nil {
		return nil, errorf(ErrIOFailure, "read the network config from stdin: %v", err)
	}
	if env.Command == CmdVersion {
		return versionInfo{CNIVersion: Version, SupportedVersions: SupportedVersions}, nil
	}
	c, err := ParseConf(b, p.Hostname)
	if c.CNIVersion != "" && atLeast(c.CNIVersion, "0.3.0") {
		*version = c.CNIVersion
	}
	if err != nil {
		return nil, err
	}
	switch env.Command {
	case CmdAdd:
		return p.add(ctx, c, env)
	case CmdDel:
		return nil, p.del(ctx, c, env)
	case CmdCheck:
		if err := needVersion(c, CmdCheck, "0.4.0"); err != nil {
			return nil, err
		}
		return nil, p.check(ctx, c, env)
	case CmdStatus:
		if err := needVersion(c, CmdStatus, "1.1.0"); err != nil {
			return nil, err
		}
		return nil, p.status(ctx, c)
	case CmdGC:
		if err := needVersion(c, CmdGC, "1.1.0"); err != nil {
			return nil, err
		}
		return nil, p.gc(ctx, c)
	}
	return nil, errorf(ErrInvalidEnvironment, "CNI_COMMAND %q", env.Command)
}

// controller makes c's API client; a file it cannot read is named.
func (p *Plugin) controller(c NetConf) (Controller, error) {
	api, err := p.NewController(c)
	if err != nil {
		return nil, asError(err, ErrInvalidConfig)
	}
	return api, nil
}

// add makes the container's VM and link, waits for the agent, and
// answers the result. What it made is undone when a later step fails: the
// runtime's DEL would do the same, but may never come.
func (p *Plugin) add(ctx context.Context, c NetConf, env Env) (any, error) {
	prev, err := parsePrev(c.PrevResult)
	if err != nil {
		return nil, err
	}
	if !p.Links.NetnsExists(env.Netns) {
		return nil, errorf(ErrUnknownContainer, "CNI_NETNS %s: no such network namespace", env.Netns)
	}
	api, err := p.controller(c)
	if err != nil {
		return nil, err
	}
	name := VMName(env.ContainerID, env.Args)
	iface := intent.VifName(c.Farm, name)
	vm, err := api.CreateVM(ctx, c.Farm, c.Subnet, name, c.Host, iface, intent.VMContainer{Network: c.Name, ID: env.ContainerID, IfName: env.IfName})
	if err != nil {
		vm, err = p.createFailed(ctx, api, c, name, iface, err)
		if err != nil {
			return nil, err
		}
	}
	undo := func() {
		p.Links.Delete(iface, env.Netns, env.IfName)
		api.DeleteVM(context.WithoutCancel(ctx), c.Farm, c.Subnet, name)
	}
	spec, err := linkSpec(vm, env)
	if err != nil {
		undo()
		return nil, asError(err, ErrControllerRefused)
	}
	hostMAC, err := p.Links.Add(spec)
	if err != nil {
		undo()
		return nil, errorf(ErrIOFailure, "vm %s: make the veth %s <-> %s in %s: %v", vm.FullName(), iface, env.IfName, env.Netns, err)
	}
	wctx, cancel := context.WithTimeout(ctx, c.Attach)
	defer cancel()
	if err := p.Links.WaitUp(wctx, iface, env.Netns, env.IfName); err != nil {
		undo()
		return nil, &Error{Code: ErrNotAttached,
			Msg:     fmt.Sprintf("vm %s: host %s's agent did not attach to %s within %s", vm.FullName(), c.Host, iface, c.Attach),
			Details: fmt.Sprintf("is `onehop agent --node %s` running on this host, in this network namespace? (%v)", c.Host, err)}
	}
	return BuildResult(c, prev, vm, hostMAC, env.IfName, env.Netns)
}

// createFailed makes sense of a failed CreateVM: a VM of this name already
// here with this network on this host is a repeated ADD (its record is
// used again); a 404 is put on the field of the config it is about.
func (p *Plugin) createFailed(ctx context.Context, api Controller, c NetConf, name, iface string, err error) (intent.VM, error) {
	if ae := apiError(err); ae != nil && ae.Status == 409 && ae.Field == "name" {
		vm, gerr := api.VM(ctx, c.Farm, c.Subnet, name)
		if gerr == nil && vm.Host == c.Host && vm.Interface == iface {
			return vm, nil
		}
	}
	missing, werr := api.Where(ctx, c.Farm, c.Subnet, c.Host)
	if werr == nil && missing != "" {
		return intent.VM{}, &Error{Code: ErrInvalidConfig, Msg: "network config: " + missing, Details: err.Error()}
	}
	return intent.VM{}, controllerError(fmt.Sprintf("create vm %s/%s/%s on %s", c.Farm, c.Subnet, name, c.Host), err)
}

// linkSpec is the link vm's container gets.
func linkSpec(vm intent.VM, env Env) (LinkSpec, error) {
	p, err := Prefix(vm)
	if err != nil {
		return LinkSpec{}, err
	}
	gw, err := netip.ParseAddr(vm.Gateway)
	if err != nil {
		return LinkSpec{}, fmt.Errorf("vm %s: gateway %q: %w", vm.FullName(), vm.Gateway, err)
	}
	return LinkSpec{HostIf: vm.Interface, Netns: env.Netns, IfName: env.IfName, MAC: vm.MAC, Address: p, Gateway: gw}, nil
}

// del removes the link and the VM; either may be gone already (a second
// DEL, a namespace the runtime removed first).
func (p *Plugin) del(ctx context.Context, c NetConf, env Env) error {
	name := VMName(env.ContainerID, env.Args)
	iface := intent.VifName(c.Farm, name)
	netns := env.Netns
	if netns != "" && !p.Links.NetnsExists(netns) {
		netns = ""
	}
	if err := p.Links.Delete(iface, netns, env.IfName); err != nil {
		return errorf(ErrIOFailure, "remove the veth %s of vm %s/%s/%s: %v", iface, c.Farm, c.Subnet, name, err)
	}
	api, err := p.controller(c)
	if err != nil {
		return err
	}
	if err := api.DeleteVM(ctx, c.Farm, c.Subnet, name); err != nil && !errors.Is(err, ErrNoVM) {
		return controllerError(fmt.Sprintf("delete vm %s/%s/%s", c.Farm, c.Subnet, name), err)
	}
	return nil
}

// gc removes what ADD made for an attachment of this network on this host
// that the runtime no longer lists as valid: a container whose DEL never
// came (docs/guests.md). Only VMs the plugin made (their record names the
// attachment) of this network, farm, subnet and host are looked at; an
// operator's VM never. A VM that cannot be removed is named; the others
// are removed all the same.
func (p *Plugin) gc(ctx context.Context, c NetConf) error {
	valid := map[Attachment]bool{}
	for _, a := range append(c.ValidAttachments, c.OldAttachments...) {
		valid[a] = true
	}
	api, err := p.controller(c)
	if err != nil {
		return err
	}
	vms, err := api.VMs(ctx, c.Farm)
	if err != nil {
		return controllerError(fmt.Sprintf("list the vms of farm %s", c.Farm), err)
	}
	var failed []string
	for _, v := range vms {
		ct := v.Container
		if ct == nil || ct.Network != c.Name || v.Subnet != c.Subnet || v.Host != c.Host ||
			valid[Attachment{ContainerID: ct.ID, IfName: ct.IfName}] {
			continue
		}
		// The container's namespace is unknown here; its end goes with
		// the host end (a veth pair) or with the namespace.
		if err := p.Links.Delete(v.Interface, "", ""); err != nil {
			failed = append(failed, fmt.Sprintf("%s (remove %s: %v)", v.FullName(), v.Interface, err))
			continue
		}
		if err := api.DeleteVM(ctx, v.Farm, v.Subnet, v.Name); err != nil && !errors.Is(err, ErrNoVM) {
			failed = append(failed, fmt.Sprintf("%s (%v)", v.FullName(), err))
		}
	}
	if len(failed) > 0 {
		return errorf(ErrIOFailure, "gc of network %s: %d stale attachment(s) not removed: %s", c.Name, len(failed), strings.Join(failed, "; "))
	}
	return nil
}

// check compares intent, the link and the ADD's result: the VM is in
// the network on this host, its veth is there and attached, the
// container's end has the VM's MAC, address and default route.
func (p *Plugin) check(ctx context.Context, c NetConf, env Env) error {
	prev, err := parsePrev(c.PrevResult)
	if err != nil {
		return err
	}
	if !p.Links.NetnsExists(env.Netns) {
		return errorf(ErrUnknownContainer, "CNI_NETNS %s: no such network namespace", env.Netns)
	}
	api, err := p.controller(c)
	if err != nil {
		return err
	}
	name := VMName(env.ContainerID, env.Args)
	vm, err := api.VM(ctx, c.Farm, c.Subnet, name)
	if errors.Is(err, ErrNoVM) {
		return errorf(ErrCheckFailed, "vm %s/%s/%s of container %s: not in the controller's intent", c.Farm, c.Subnet, name, env.ContainerID)
	}
	if err != nil {
		return controllerError("read vm "+c.Farm+"/"+c.Subnet+"/"+name, err)
	}
	if vm.Host != c.Host {
		return errorf(ErrCheckFailed, "vm %s is on host %s in the intent, not on %s", vm.FullName(), vm.Host, c.Host)
	}
	if err := checkPrev(prev, vm, env.IfName, env.Netns); err != nil {
		return err
	}
	st, err := p.Links.Inspect(vm.Interface, env.Netns, env.IfName)
	if err != nil {
		return errorf(ErrIOFailure, "read the veth of vm %s: %v", vm.FullName(), err)
	}
	return CheckLink(vm, env.IfName, st)
}

// CheckLink says what of st differs from what vm's container should have
// on ifname.
func CheckLink(vm intent.VM, ifname string, st LinkState) error {
	p, err := Prefix(vm)
	if err != nil {
		return err
	}
	fail := func(format string, a ...any) error {
		return errorf(ErrCheckFailed, "vm %s: "+format, append([]any{vm.FullName()}, a...)...)
	}
	switch {
	case st.HostKind == "":
		return fail("no interface %s on the host", vm.Interface)
	case st.HostKind != "veth":
		return fail("host interface %s is a %s, not a veth", vm.Interface, st.HostKind)
	case !st.HostUp:
		return fail("host interface %s is down: the agent has not attached to it", vm.Interface)
	case !st.PeerFound:
		return fail("no %s in the container's namespace at the other end of %s", ifname, vm.Interface)
	case !strings.EqualFold(st.PeerMAC, vm.MAC):
		return fail("%s has MAC %s, want %s", ifname, st.PeerMAC, vm.MAC)
	}
	found := false
	for _, a := range st.Addrs {
		if a == p {
			found = true
		} else {
			return fail("%s has the address %s, which is not the VM's (%s)", ifname, a, p)
		}
	}
	if !found {
		return fail("%s has no address %s", ifname, p)
	}
	gw, err := netip.ParseAddr(vm.Gateway)
	if err != nil {
		return fail("gateway %q is not an address", vm.Gateway)
	}
	if st.Gateway != gw {
		if !st.Gateway.IsValid() {
			return fail("no default route via %s", gw)
		}
		return fail("the default route is via %s, want %s", st.Gateway, gw)
	}
	return nil
}

// status answers whether an ADD could succeed now: the controller answers
// and knows the network's farm, subnet and this host.
func (p *Plugin) status(ctx context.Context, c NetConf) error {
	api, err := p.NewController(c)
	if err != nil {
		return &Error{Code: ErrNotAvailable, Msg: "network config: " + err.Error()}
	}
	missing, err := api.Where(ctx, c.Farm, c.Subnet, c.Host)
	if err != nil {
		return &Error{Code: ErrNotAvailable, Msg: fmt.Sprintf("controller %s: %v", c.API, err)}
	}
	if missing != "" {
		return &Error{Code: ErrNotAvailable, Msg: "network config: " + missing}
	}
	return nil
}
