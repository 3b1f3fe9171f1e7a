package controller

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
)

// Hosts write only their own keys, and etcd itself says so: with TLS the
// controller turns on etcd's authentication (store.EnableAuth), so that a
// client is the user its certificate's common name names, and keeps one
// user per host, named as the host (the CN of its agent's certificate),
// holding one role that grants exactly intent.AgentReads and
// intent.AgentWrites. The controller's own certificate is etcd's
// administrator. Any other certificate the CA signed is no user and may do
// nothing in etcd. A host gets its user before its record exists (AddHost),
// and loses it before its agent's records are deleted (RemoveHost), so a
// host's agent can never write after its host is gone.

// AgentRolePrefix begins the name of every host agent's etcd role
// (AgentRolePrefix + HOST): the controller removes a role of that name
// whose host is gone, and no other.
const AgentRolePrefix = "onehop-agent-"

// etcdAuth is the cluster whose users the controller keeps, and the name
// of its own user there.
type etcdAuth struct {
	etcd  *store.Etcd
	admin string
}

// EnableEtcdAuth turns etcd's authentication on (if it is not) with admin,
// the common name of the certificate the controller dials e with, as its
// administrator, and from then on keeps a user per host in e
// (SyncAgentUsers, AddHost, RemoveHost).
func (c *Controller) EnableEtcdAuth(ctx context.Context, e *store.Etcd, admin string) error {
	if admin == "" {
		return fmt.Errorf("etcd auth: the controller's certificate has no common name to be etcd's administrator by")
	}
	if err := e.EnableAuth(ctx, admin); err != nil {
		return fmt.Errorf("etcd auth as %s: %w", admin, err)
	}
	c.auth = &etcdAuth{etcd: e, admin: admin}
	return nil
}

// agentGrants are what host's agent may do, as etcd grants.
func agentGrants(host string) []store.Grant {
	var g []store.Grant
	for _, p := range intent.AgentReads(host) {
		g = append(g, store.Grant{Key: p, Prefix: true})
	}
	for _, k := range intent.AgentWrites(host) {
		g = append(g, store.Grant{Key: k, Write: true})
	}
	return g
}

// grantAgent gives host's agent certificate its user and role. Without
// etcd auth (an --insecure controller, the memory store) it does nothing.
func (c *Controller) grantAgent(ctx context.Context, host string) error {
	if c.auth == nil {
		return nil
	}
	if host == store.EtcdRoot || host == c.auth.admin {
		return fieldErr("name", fmt.Errorf("host name %q is etcd's administrator (root, or the controller's certificate's common name %q): its agent's certificate would administer etcd; choose another name", host, c.auth.admin))
	}
	if err := c.auth.etcd.SetUserRole(ctx, host, AgentRolePrefix+host, agentGrants(host)); err != nil {
		return fmt.Errorf("host %s's etcd user: %w", host, err)
	}
	return nil
}

// revokeAgent removes host's agent's user and role: its certificate may
// do nothing in etcd from then on.
func (c *Controller) revokeAgent(ctx context.Context, host string) error {
	if c.auth == nil || host == store.EtcdRoot || host == c.auth.admin {
		return nil
	}
	if err := c.auth.etcd.RemoveUserRole(ctx, host, AgentRolePrefix+host); err != nil {
		return fmt.Errorf("host %s's etcd user: %w", host, err)
	}
	return nil
}

// SyncAgentUsers gives every host of the intent its agent's user and role,
// as they should be, and removes those of hosts that are gone: at start,
// for hosts a topology file made, a store of before auth, or a host
// removed while the controller was down.
func (c *Controller) SyncAgentUsers(ctx context.Context) error {
	if c.auth == nil {
		return nil
	}
	hosts, _, err := store.ListJSON[intent.Host](ctx, c.raw, intent.HostsPrefix)
	if err != nil {
		return err
	}
	names := make([]string, 0, len(hosts))
	for _, h := range hosts {
		if err := c.grantAgent(ctx, h.Name); err != nil {
			return err
		}
		names = append(names, h.Name)
	}
	roles, err := c.auth.etcd.Roles(ctx)
	if err != nil {
		return err
	}
	for _, r := range roles {
		host, ok := strings.CutPrefix(r, AgentRolePrefix)
		if !ok || slices.Contains(names, host) {
			continue
		}
		if err := c.revokeAgent(ctx, host); err != nil {
			return err
		}
	}
	c.log.Info("etcd auth: one user per host agent", "hosts", len(names), "admin", c.auth.admin)
	return nil
}
