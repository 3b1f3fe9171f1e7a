package store

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"go.etcd.io/etcd/api/v3/authpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// etcd's own access control, as onehop uses it: users without passwords,
// so that a user is only ever a client certificate whose common name is
// the user's name (etcd's --client-cert-auth maps the CN to the user), and
// one role per user holding exactly the keys it may read or write.

// EtcdRoot is etcd's administrator user and role: a user holding the root
// role may do everything, and auth cannot be enabled before it exists.
const EtcdRoot = "root"

// Grant is one key, or every key under a prefix, that a role may read, or
// read and write.
type Grant struct {
	Key    string
	Prefix bool // every key starting with Key
	Write  bool // read and write; else read only
}

func (g Grant) String() string {
	s := "read " + g.Key
	if g.Write {
		s = "readwrite " + g.Key
	}
	if g.Prefix {
		s += "*"
	}
	return s
}

// rangeEnd is etcd's range end of g: none for one key, the prefix's end
// for a prefix.
func (g Grant) rangeEnd() string {
	if !g.Prefix {
		return ""
	}
	return clientv3.GetPrefixRangeEnd(g.Key)
}

func (g Grant) permType() authpb.Permission_Type {
	if g.Write {
		return clientv3.PermReadWrite
	}
	return clientv3.PermRead
}

// ErrNoAuthStatus is AuthEnabled's answer from a cluster that cannot say
// (etcd before 3.5 has no AuthStatus).
var ErrNoAuthStatus = errors.New("etcd says nothing of its auth (AuthStatus is etcd 3.5's)")

// AuthEnabled reports whether the cluster checks users and roles.
func (e *Etcd) AuthEnabled(ctx context.Context) (bool, error) {
	r, err := e.c.AuthStatus(ctx)
	if status.Code(err) == codes.Unimplemented {
		return false, ErrNoAuthStatus
	}
	if err != nil {
		return false, fmt.Errorf("etcd auth status: %w", err)
	}
	return r.Enabled, nil
}

// EnableAuth makes admin (the common name of the certificate this client
// dials with) an administrator of the cluster and turns etcd's
// authentication on, so that from then on a client is only what its
// certificate's user may do, and a certificate whose CN is no user may do
// nothing. It does nothing once auth is on (this client is then admin
// already, or gets permission denied on what it does next); a cluster that
// cannot say whether it is on gets every step, each of which does nothing
// when done already (auth on, this client admin). etcd refuses to
// enable auth before the root user and role exist: both are made, the root
// user without a password (no password can log in as it).
func (e *Etcd) EnableAuth(ctx context.Context, admin string) error {
	on, err := e.AuthEnabled(ctx)
	if errors.Is(err, ErrNoAuthStatus) {
		on, err = false, nil
	}
	if err != nil || on {
		return err
	}
	if err := e.ensureRole(ctx, EtcdRoot); err != nil {
		return err
	}
	for _, u := range []string{EtcdRoot, admin} {
		if err := e.ensureUser(ctx, u, EtcdRoot); err != nil {
			return err
		}
	}
	if _, err := e.c.AuthEnable(ctx); err != nil {
		return fmt.Errorf("etcd auth enable: %w", err)
	}
	return nil
}

// SetUserRole makes user a user without password holding role and no other,
// and role grant exactly grants: what is missing is granted before what is
// no longer wanted is revoked, so a user that keeps a permission never
// loses it on the way.
func (e *Etcd) SetUserRole(ctx context.Context, user, role string, grants []Grant) error {
	if err := e.ensureRole(ctx, role); err != nil {
		return err
	}
	r, err := e.c.RoleGet(ctx, role)
	if err != nil {
		return fmt.Errorf("etcd role %s: %w", role, err)
	}
	type perm struct {
		key, end string
		t        authpb.Permission_Type
	}
	have := map[perm]bool{}
	for _, p := range r.Perm {
		have[perm{string(p.Key), string(p.RangeEnd), p.PermType}] = true
	}
	want := map[perm]bool{}
	for _, g := range grants {
		p := perm{g.Key, g.rangeEnd(), g.permType()}
		want[p] = true
		if have[p] {
			continue
		}
		if _, err := e.c.RoleGrantPermission(ctx, role, p.key, p.end, clientv3.PermissionType(p.t)); err != nil {
			return fmt.Errorf("etcd role %s: grant %s: %w", role, g, err)
		}
	}
	for p := range have {
		if want[p] {
			continue
		}
		if _, err := e.c.RoleRevokePermission(ctx, role, p.key, p.end); err != nil && !errors.Is(err, rpctypes.ErrPermissionNotGranted) {
			return fmt.Errorf("etcd role %s: revoke %s..%s: %w", role, p.key, p.end, err)
		}
	}
	return e.ensureUser(ctx, user, role)
}

// RemoveUserRole deletes user and role; either missing is not an error.
// The user goes first: from then on its certificate may do nothing.
func (e *Etcd) RemoveUserRole(ctx context.Context, user, role string) error {
	if _, err := e.c.UserDelete(ctx, user); err != nil && !errors.Is(err, rpctypes.ErrUserNotFound) {
		return fmt.Errorf("etcd delete user %s: %w", user, err)
	}
	if _, err := e.c.RoleDelete(ctx, role); err != nil && !errors.Is(err, rpctypes.ErrRoleNotFound) {
		return fmt.Errorf("etcd delete role %s: %w", role, err)
	}
	return nil
}

// Roles lists the cluster's roles.
func (e *Etcd) Roles(ctx context.Context) ([]string, error) {
	r, err := e.c.RoleList(ctx)
	if err != nil {
		return nil, fmt.Errorf("etcd role list: %w", err)
	}
	return r.Roles, nil
}

func (e *Etcd) ensureRole(ctx context.Context, role string) error {
	if _, err := e.c.RoleAdd(ctx, role); err != nil && !errors.Is(err, rpctypes.ErrRoleAlreadyExist) {
		return fmt.Errorf("etcd add role %s: %w", role, err)
	}
	return nil
}

// ensureUser makes user a user without password that holds role and no
// other: a user of that name made by someone else for something else
// keeps nothing it had.
func (e *Etcd) ensureUser(ctx context.Context, user, role string) error {
	var roles []string
	u, err := e.c.UserGet(ctx, user)
	switch {
	case errors.Is(err, rpctypes.ErrUserNotFound):
		if _, err := e.c.UserAddWithOptions(ctx, user, "", &clientv3.UserAddOptions{NoPassword: true}); err != nil {
			return fmt.Errorf("etcd add user %s: %w", user, err)
		}
	case err != nil:
		return fmt.Errorf("etcd user %s: %w", user, err)
	default:
		roles = u.Roles
	}
	if !slices.Contains(roles, role) {
		if _, err := e.c.UserGrantRole(ctx, user, role); err != nil {
			return fmt.Errorf("etcd grant role %s to user %s: %w", role, user, err)
		}
	}
	for _, r := range roles {
		if r == role {
			continue
		}
		if _, err := e.c.UserRevokeRole(ctx, user, r); err != nil && !errors.Is(err, rpctypes.ErrRoleNotGranted) {
			return fmt.Errorf("etcd revoke role %s from user %s: %w", r, user, err)
		}
	}
	return nil
}
