package pki

import (
	"crypto/x509"
	"slices"
	"strings"
)

// TenantOrganization is the subject organization (O) of a tenant's client
// certificate; its common name (CN) is TenantCNPrefix and the one farm it
// may act on (docs/tenants.md). Every other certificate the CA signs is an
// admin's on the REST API.
const TenantOrganization = "onehop-tenant"

// TenantCNPrefix starts a tenant certificate's common name. etcd takes a
// certificate's CN for its user, and each host's agent is the etcd user of
// its host name: a bare farm name as CN would make the tenant of a farm
// called like a host that host's agent to etcd. No host name has a ':'.
const TenantCNPrefix = "tenant:"

// TenantRequest is the request for a client certificate of farm's tenant:
// O=onehop-tenant, CN=tenant:farm.
func TenantRequest(farm string) Request {
	return Request{Kind: Client, CommonName: TenantCNPrefix + farm, Organization: TenantOrganization}
}

// TenantFarm returns the farm a tenant's certificate is scoped to ("" when
// its CN names none), or false for any other certificate.
func TenantFarm(c *x509.Certificate) (string, bool) {
	if c == nil || !slices.Contains(c.Subject.Organization, TenantOrganization) {
		return "", false
	}
	// A tenant certificate without the prefix names no farm (""), and is
	// refused, never taken for an admin's.
	farm, _ := strings.CutPrefix(c.Subject.CommonName, TenantCNPrefix)
	if farm == c.Subject.CommonName {
		return "", true
	}
	return farm, true
}
