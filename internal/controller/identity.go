package controller

import (
	"context"
	"fmt"

	"github.com/onehop/onehop/internal/pki"
)

// Identity is who a request acts as (docs/tenants.md): an admin, who may
// do everything, or a tenant, who may act only on Farm.
type Identity struct {
	// Farm is the one farm a tenant credential is scoped to; "" for an
	// admin.
	Farm string
	// Via is how the request proved it: "token" (the admin bearer token),
	// "tenant-token", "cert" (a client certificate) or "socket" (the
	// root-only unix socket).
	Via string
	// Name tells credentials of one kind apart: a tenant token's id, a
	// certificate's common name.
	Name string
}

// Admin reports whether the identity may do everything.
func (id Identity) Admin() bool { return id.Farm == "" }

// String is how the audit trail names who acted: "admin (token)",
// "admin (cert controller)", "tenant blue (token 3f2a…)", "tenant blue (cert)".
func (id Identity) String() string {
	who := "admin"
	if !id.Admin() {
		who = "tenant " + id.Farm
	}
	via := id.Via
	if via == "tenant-token" {
		via = "token"
	}
	if id.Name != "" && !(id.Via == "cert" && id.Name == pki.TenantCNPrefix+id.Farm) {
		via += " " + id.Name
	}
	return fmt.Sprintf("%s (%s)", who, via)
}

type identityKey struct{}

// WithIdentity returns ctx carrying id: Authenticate attaches what the
// credential proved, a unix-socket server attaches SocketAdmin.
func WithIdentity(ctx context.Context, id Identity) context.Context {
	return context.WithValue(ctx, identityKey{}, id)
}

// SocketAdmin is the identity of a request on the API's unix socket: only
// root may connect to it (mode 0600), and root on the controller's machine
// can read every credential there anyway.
var SocketAdmin = Identity{Via: "socket"}

// IdentityOf returns the identity a request's context carries. One with
// none came through no authenticating listener: the unix socket, or a
// caller in this process (tests, the lab); it is SocketAdmin. Every
// request on the TCP listener carries one (Authenticate refuses it first
// otherwise).
func IdentityOf(ctx context.Context) Identity {
	if id, ok := ctx.Value(identityKey{}).(Identity); ok {
		return id
	}
	return SocketAdmin
}
