package gateway

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// The MPTCP path manager's generic netlink interface (uapi linux/mptcp.h).
const (
	mptcpPMName    = "mptcp_pm"
	mptcpPMVersion = 1

	mptcpPMCmdSubflowCreate  = 10
	mptcpPMCmdSubflowDestroy = 11

	mptcpPMAttrAddr       = 1
	mptcpPMAttrToken      = 4
	mptcpPMAttrAddrRemote = 6

	mptcpPMAddrAttrFamily = 1
	mptcpPMAddrAttrID     = 2
	mptcpPMAddrAttrAddr4  = 3
	mptcpPMAddrAttrPort   = 5
	mptcpPMAddrAttrFlags  = 6

	mptcpPMAddrFlagSubflow = 1 << 1
)

// PathManager creates and destroys subflows of one MPTCP connection (the
// kernel's userspace path manager, net.mptcp.pm_type=1): the gateway
// decides each connection's subflows itself, one per usable RLOC, instead
// of the in-kernel manager's one set of endpoints for every connection.
type PathManager interface {
	// Create opens a subflow of the connection with token from local
	// (with the address id, unique in the connection and not 0) to remote.
	Create(token uint32, id uint8, local netip.Addr, remote netip.AddrPort) error
	// Destroy closes the subflow local -> remote.
	Destroy(token uint32, local, remote netip.AddrPort) error
}

// NetlinkPM is the PathManager of the caller's network namespace.
type NetlinkPM struct {
	once   sync.Once
	family uint16
	err    error
}

func (p *NetlinkPM) familyID() (uint16, error) {
	p.once.Do(func() {
		f, err := netlink.GenlFamilyGet(mptcpPMName)
		if err != nil {
			p.err = fmt.Errorf("mptcp path manager: generic netlink family %s: %w", mptcpPMName, err)
			return
		}
		p.family = f.ID
	})
	return p.family, p.err
}

func addrAttr(typ int, a netip.Addr, port uint16, id uint8, flags uint32) *nl.RtAttr {
	at := nl.NewRtAttr(typ|unix.NLA_F_NESTED, nil)
	at.AddRtAttr(mptcpPMAddrAttrFamily, nl.Uint16Attr(unix.AF_INET))
	a4 := a.As4()
	at.AddRtAttr(mptcpPMAddrAttrAddr4, a4[:])
	if port != 0 {
		at.AddRtAttr(mptcpPMAddrAttrPort, nl.Uint16Attr(port))
	}
	if id != 0 {
		at.AddRtAttr(mptcpPMAddrAttrID, nl.Uint8Attr(id))
	}
	if flags != 0 {
		at.AddRtAttr(mptcpPMAddrAttrFlags, nl.Uint32Attr(flags))
	}
	return at
}

func (p *NetlinkPM) do(cmd uint8, attrs ...*nl.RtAttr) error {
	fam, err := p.familyID()
	if err != nil {
		return err
	}
	req := nl.NewNetlinkRequest(int(fam), unix.NLM_F_ACK)
	req.AddData(&nl.Genlmsg{Command: cmd, Version: mptcpPMVersion})
	for _, a := range attrs {
		req.AddData(a)
	}
	_, err = req.Execute(unix.NETLINK_GENERIC, 0)
	return err
}

func tokenAttr(token uint32) *nl.RtAttr {
	b := make([]byte, 4)
	binary.NativeEndian.PutUint32(b, token)
	return nl.NewRtAttr(mptcpPMAttrToken, b)
}

// Create implements PathManager.
func (p *NetlinkPM) Create(token uint32, id uint8, local netip.Addr, remote netip.AddrPort) error {
	err := p.do(mptcpPMCmdSubflowCreate,
		tokenAttr(token),
		addrAttr(mptcpPMAttrAddr, local, 0, id, mptcpPMAddrFlagSubflow),
		addrAttr(mptcpPMAttrAddrRemote, remote.Addr(), remote.Port(), 0, 0))
	if err != nil {
		return fmt.Errorf("mptcp subflow create %s -> %s (token %08x): %w", local, remote, token, err)
	}
	return nil
}

// Destroy implements PathManager.
func (p *NetlinkPM) Destroy(token uint32, local, remote netip.AddrPort) error {
	err := p.do(mptcpPMCmdSubflowDestroy,
		tokenAttr(token),
		addrAttr(mptcpPMAttrAddr, local.Addr(), local.Port(), 0, 0),
		addrAttr(mptcpPMAttrAddrRemote, remote.Addr(), remote.Port(), 0, 0))
	if err != nil {
		return fmt.Errorf("mptcp subflow destroy %s -> %s (token %08x): %w", local, remote, token, err)
	}
	return nil
}
