package pki

import (
	"crypto/x509"
	"slices"
)

// TenantOrganization is the subject organization (O) of a tenant's client
// certificate; its common name (CN) is the one farm it may act on
// (docs/tenants.md). Every other certificate the CA signs is an admin's on
// the REST API.
const TenantOrganization = "onehop-tenant"

// TenantRequest is the request for a client certificate of farm's tenant:
// O=onehop-tenant, CN=farm.
func TenantRequest(farm string) Request {
	return Request{Kind: Client, CommonName: farm, Organization: TenantOrganization}
}

// TenantFarm returns the farm a tenant's certificate is scoped to, or false
// for any other certificate.
func TenantFarm(c *x509.Certificate) (string, bool) {
	if c == nil || !slices.Contains(c.Subject.Organization, TenantOrganization) {
		return "", false
	}
	return c.Subject.CommonName, true
}
