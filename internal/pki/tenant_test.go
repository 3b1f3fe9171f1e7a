package pki

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"testing"
)

func TestTenantFarmNeedsItsPrefixAndIsNeverAnAdminWithoutIt(t *testing.T) {
	for _, tc := range []struct {
		subject  pkix.Name
		farm     string
		isTenant bool
	}{
		{pkix.Name{Organization: []string{TenantOrganization}, CommonName: "tenant:blue"}, "blue", true},
		// A bare farm name could be a host's name, its agent's etcd user.
		{pkix.Name{Organization: []string{TenantOrganization}, CommonName: "blue"}, "", true},
		{pkix.Name{CommonName: "tenant:blue"}, "", false},
		{pkix.Name{CommonName: "h1"}, "", false},
	} {
		farm, ok := TenantFarm(&x509.Certificate{Subject: tc.subject})
		if farm != tc.farm || ok != tc.isTenant {
			t.Errorf("TenantFarm(%v) = %q, %v; want %q, %v", tc.subject, farm, ok, tc.farm, tc.isTenant)
		}
	}
	if cn := TenantRequest("blue").CommonName; cn != "tenant:blue" {
		t.Errorf("TenantRequest(blue) has CN %q", cn)
	}
}
