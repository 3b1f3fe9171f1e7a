package pki

import (
	"crypto/x509"
	"fmt"
	"math/big"
	"slices"
	"strings"
	"time"
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

// Backdate is how far before its issue a certificate's NotBefore is set,
// to tolerate a little clock skew between components.
const Backdate = time.Minute

// IssuedAt is when the CA issued c: its NotBefore plus Backdate, to the
// second (a certificate's times have no finer grain). A farm's certificate
// revocation refuses those issued at or before its time by this.
func IssuedAt(c *x509.Certificate) time.Time { return c.NotBefore.Add(Backdate) }

// SerialHex is c's serial number as the controller's revocations name it:
// lower-case hex, no leading zeros, no colons.
func SerialHex(c *x509.Certificate) string { return c.SerialNumber.Text(16) }

// ParseSerial reads a serial number as an operator copies it: hex, with or
// without colons (openssl's "3a:5b:...") or a 0x prefix, and returns it as
// SerialHex writes it.
func ParseSerial(s string) (string, error) {
	h := strings.ToLower(strings.TrimPrefix(strings.TrimPrefix(strings.ReplaceAll(strings.TrimSpace(s), ":", ""), "0x"), "0X"))
	n, ok := new(big.Int).SetString(h, 16)
	if h == "" || !ok || n.Sign() <= 0 || len(h) > 40 {
		return "", fmt.Errorf("serial %q: want a certificate's serial number in hex (as openssl x509 -serial prints it), at most 20 bytes", s)
	}
	return n.Text(16), nil
}
