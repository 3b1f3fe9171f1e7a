package vcmp

import (
	"errors"
	"fmt"
	"net/netip"
)

// State is where a connection is in its migration (paper §3.3; the states
// `onehop vnat status` shows).
type State uint8

// Connection states.
const (
	// Active: never moved, or settled again; packets may or may not be translated.
	Active State = iota
	// Suspended: roles negotiated or being negotiated; one end is away or
	// about to leave, or a resumed end stored its location and waits for its peer.
	Suspended
	// Locating: this end has resumed at a new place and is looking for its peer.
	Locating
	// Migrated: the peer and this end exchanged VNAT_UPD/VNAT_UPD_R; the
	// connection runs translated.
	Migrated
	// Aborted: no place knew the peer and none stored this end's location
	// (paper P(3)/S(3): "the migration of the connection will be aborted").
	Aborted
)

var stateNames = [...]string{"active", "suspended", "locating", "migrated", "aborted"}

// String is the state's name in status output.
func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("state %d", uint8(s))
}

// Role is an end's migration role (paper §3.3.1.2).
type Role uint8

// Roles.
const (
	RoleNone Role = iota
	RolePrimary
	RoleSecondary
)

// String is the role's name in status output.
func (r Role) String() string {
	switch r {
	case RoleNone:
		return "none"
	case RolePrimary:
		return "primary"
	case RoleSecondary:
		return "secondary"
	}
	return fmt.Sprintf("role %d", uint8(r))
}

// Event is something that happens to a connection.
type Event uint8

// Events.
const (
	// EvSuspend: this end is about to move (`onehop vnat suspend`).
	EvSuspend Event = iota
	// EvRecvSuspPrimary: the peer sent VNAT_SUSP_PRIMARY.
	EvRecvSuspPrimary
	// EvRecvSuspSecondary: the peer answered our VNAT_SUSP_PRIMARY.
	EvRecvSuspSecondary
	// EvTimeout: no answer to our VNAT_SUSP_PRIMARY in time.
	EvTimeout
	// EvResume: this end is up at a new address (or its address changed
	// under it, with no suspension: a pulled cable), or a waiting end retries.
	EvResume
	// EvFound: locating found the peer's new physical endpoint.
	EvFound
	// EvStored: locating found nothing but stored this end's new location.
	EvStored
	// EvLocateFailed: no place answered (every P/S step failed).
	EvLocateFailed
	// EvRecvUpdate: the peer's VNAT_UPD arrived and was admitted by Open.
	EvRecvUpdate
	// EvRecvUpdateReply: the peer's VNAT_UPD_R (status OK) arrived and was admitted by Open.
	EvRecvUpdateReply
)

var eventNames = [...]string{"suspend", "recv VNAT_SUSP_PRIMARY", "recv VNAT_SUSP_SECONDARY", "timeout",
	"resume", "found", "stored", "locate failed", "recv VNAT_UPD", "recv VNAT_UPD_R"}

// String names the event.
func (e Event) String() string {
	if int(e) < len(eventNames) {
		return eventNames[e]
	}
	return fmt.Sprintf("event %d", uint8(e))
}

// Action is something the daemon must do after a transition, in order.
type Action uint8

// Actions.
const (
	ActSendSuspPrimary   Action = iota + 1 // send VNAT_SUSP_PRIMARY
	ActSendSuspSecondary                   // send VNAT_SUSP_SECONDARY
	ActSendKey                             // send VCMP_KEY with this connection's public key (with the SUSP message)
	ActStartHelper                         // the peer is away: start the migration helper (keepalives, cgroup freeze)
	ActStopHelper                          // the peer is back: stop the helper
	ActLocate                              // walk LocateOrder(Role, ...) with a Locator
	ActSendUpdate                          // send (sealed) VNAT_UPD to the peer's new place
	ActSendUpdateReply                     // answer the peer's VNAT_UPD with (sealed) VNAT_UPD_R
	ActApplyPeer                           // write the peer's new physical endpoint into the translation
)

var actionNames = [...]string{"", "send VNAT_SUSP_PRIMARY", "send VNAT_SUSP_SECONDARY", "send VCMP_KEY",
	"start helper", "stop helper", "locate", "send VNAT_UPD", "send VNAT_UPD_R", "apply peer"}

// String names the action.
func (a Action) String() string {
	if int(a) < len(actionNames) && a != 0 {
		return actionNames[a]
	}
	return fmt.Sprintf("action %d", uint8(a))
}

// ErrUnexpected is returned (wrapped) for an event a connection's state does
// not allow; the connection is left unchanged.
var ErrUnexpected = errors.New("unexpected event")

// Conn is one connection's migration state machine. It is pure: Step
// returns what to send and do, the daemon does it.
type Conn struct {
	Tuple Tuple
	State State
	Role  Role
	// Awaiting: we sent VNAT_SUSP_PRIMARY and have no answer yet.
	Awaiting bool
	// Moving: this end is leaving or has left its old place.
	Moving bool
	// Helper: the migration helper runs for this connection.
	Helper bool
	// Updating: we sent VNAT_UPD and wait for VNAT_UPD_R.
	Updating bool
}

// NewConn is a connection as recorded when it opens: active, no role.
func NewConn(t Tuple) *Conn { return &Conn{Tuple: t, State: Active} }

// endpointLess orders virtual endpoints by address, then port.
func endpointLess(a, b netip.AddrPort) bool {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c < 0
	}
	return a.Port() < b.Port()
}

// Arbitrate decides crossing VNAT_SUSP_PRIMARYs (paper §3.3.1.2, figure
// 3-4(b)): the end with the higher virtual address is the primary. Both ends
// see the same two virtual endpoints, so they decide alike without another
// message; equal addresses (both ends on one host) fall back to the port.
func Arbitrate(t Tuple) Role {
	if endpointLess(t.Remote, t.Local) {
		return RolePrimary
	}
	return RoleSecondary
}

func (c *Conn) unexpected(ev Event) error {
	return fmt.Errorf("vcmp: connection %v in state %s (role %s): %s: %w", c.Tuple, c.State, c.Role, ev, ErrUnexpected)
}

// settle is the end of a migration: translated, roles forgotten.
func (c *Conn) settle(acts []Action) []Action {
	if c.Helper {
		acts = append(acts, ActStopHelper)
	}
	c.State, c.Role = Migrated, RoleNone
	c.Awaiting, c.Moving, c.Helper, c.Updating = false, false, false, false
	return acts
}

// Step applies one event and returns the actions it calls for. On an event
// the state does not allow it returns an error wrapping ErrUnexpected and
// changes nothing.
func (c *Conn) Step(ev Event) ([]Action, error) {
	switch c.State {
	case Active, Migrated:
		switch ev {
		case EvSuspend:
			// §3.3.1.2: the end about to move claims the primary role.
			c.State, c.Role, c.Awaiting, c.Moving = Suspended, RolePrimary, true, true
			return []Action{ActSendSuspPrimary, ActSendKey}, nil
		case EvRecvSuspPrimary:
			// Figure 3-4(a): a PRIMARY before we sent ours makes us secondary.
			c.State, c.Role, c.Helper = Suspended, RoleSecondary, true
			return []Action{ActSendSuspSecondary, ActSendKey, ActStartHelper}, nil
		case EvResume:
			// Moved with no negotiation (a pulled cable): default to primary (§3.3.2.1).
			c.State, c.Role, c.Moving = Locating, RolePrimary, true
			return []Action{ActLocate}, nil
		case EvRecvUpdate:
			// The peer moved with no negotiation and found us.
			return c.settle([]Action{ActApplyPeer, ActSendUpdateReply}), nil
		}
	case Suspended:
		if c.Awaiting {
			switch ev {
			case EvRecvSuspSecondary:
				c.Awaiting = false // confirmed primary
				return nil, nil
			case EvRecvSuspPrimary:
				// Crossing PRIMARYs (figure 3-4(b)): arbitrate, send nothing more.
				c.Awaiting, c.Role = false, Arbitrate(c.Tuple)
				return nil, nil
			case EvTimeout:
				c.Awaiting = false // no answer: primary by default
				return nil, nil
			case EvResume:
				c.Awaiting, c.State = false, Locating
				return []Action{ActLocate}, nil
			case EvSuspend:
				return nil, nil // already suspending
			}
			break
		}
		switch ev {
		case EvSuspend:
			// A secondary that moves too (§4.2) keeps its role; nothing to send.
			c.Moving = true
			return nil, nil
		case EvRecvSuspPrimary:
			if c.Role == RoleSecondary && !c.Moving {
				// The peer retransmitted: answer again with the same key.
				return []Action{ActSendSuspSecondary, ActSendKey}, nil
			}
		case EvResume:
			// Up at the new place, or a waiting end retrying its walk.
			c.State, c.Moving = Locating, true
			if c.Role == RoleNone {
				c.Role = RolePrimary
			}
			return []Action{ActLocate}, nil
		case EvRecvUpdate:
			return c.settle([]Action{ActApplyPeer, ActSendUpdateReply}), nil
		}
	case Locating:
		switch ev {
		case EvFound:
			c.Updating = true
			return []Action{ActSendUpdate}, nil
		case EvRecvUpdateReply:
			if c.Updating {
				return c.settle([]Action{ActApplyPeer}), nil
			}
		case EvStored:
			if !c.Updating {
				c.State = Suspended // wait for the peer to find our location (P(1): "returns to suspended state")
				return nil, nil
			}
		case EvLocateFailed:
			if !c.Updating {
				acts := []Action(nil)
				if c.Helper {
					acts = append(acts, ActStopHelper)
				}
				c.State, c.Helper = Aborted, false
				return acts, nil
			}
		case EvRecvUpdate:
			// The peer found our stored location first.
			return c.settle([]Action{ActApplyPeer, ActSendUpdateReply}), nil
		case EvResume:
			c.Updating = false // address changed again: start over
			return []Action{ActLocate}, nil
		}
	case Aborted:
		// Terminal: the daemon forgets the connection.
	}
	return nil, c.unexpected(ev)
}
