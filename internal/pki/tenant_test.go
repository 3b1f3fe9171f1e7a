package pki

import (
	"crypto/x509"
	"crypto/x509/pkix"
	"strings"
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

func TestParseSerialTakesWhatOperatorsCopy(t *testing.T) {
	for in, want := range map[string]string{"3A:5B:07": "3a5b07", "0x3a5b07": "3a5b07", " 00:ff ": "ff", "1": "1"} {
		if got, err := ParseSerial(in); err != nil || got != want {
			t.Errorf("ParseSerial(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "zz", "0", "-1", "3a 5b", strings.Repeat("f", 41)} {
		if got, err := ParseSerial(bad); err == nil || !strings.Contains(err.Error(), "serial") {
			t.Errorf("ParseSerial(%q) = %q, %v; want an error naming the serial", bad, got, err)
		}
	}
}
