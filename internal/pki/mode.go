package pki

import (
	"fmt"
	"net/url"
	"strings"
)

// The flags every daemon takes for its TLS material, named in errors.
const (
	FlagCA       = "--tls-ca"
	FlagCert     = "--tls-cert"
	FlagKey      = "--tls-key"
	FlagInsecure = "--insecure"
)

// CheckMode validates a daemon's choice between TLS and plain TCP: either
// all three files are named, or none is and insecure is set. what says what
// the files are for, e.g. "the agent dials etcd".
func (f Files) CheckMode(insecure bool, what string) error {
	if insecure {
		if !f.Empty() {
			return fmt.Errorf("%s contradicts %s/%s/%s: give the TLS files or %s, not both", FlagInsecure, FlagCA, FlagCert, FlagKey, FlagInsecure)
		}
		return nil
	}
	if f.Empty() {
		return fmt.Errorf("%s over TLS with client certificates: pass %s CA.pem %s CERT.pem %s KEY.pem "+
			"(`onehop lab up` makes them under /run/onehop/LAB/pki), or %s to run over plain, unauthenticated TCP that anyone on the fabric can use",
			what, FlagCA, FlagCert, FlagKey, FlagInsecure)
	}
	var missing []string
	for _, m := range []struct{ flag, v string }{{FlagCA, f.CA}, {FlagCert, f.Cert}, {FlagKey, f.Key}} {
		if m.v == "" {
			missing = append(missing, m.flag)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%s missing: TLS needs %s, %s and %s together", strings.Join(missing, " and "), FlagCA, FlagCert, FlagKey)
	}
	return nil
}

// CheckURL checks that a TCP URL given with flag matches the mode: https://
// with TLS, http:// only with insecure. unix:// sockets are local and plain
// either way (file permissions protect them).
func CheckURL(flag, raw string, insecure bool) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("%s %q: want https://HOST:PORT (or http:// with %s): %w", flag, raw, FlagInsecure, err)
	}
	switch u.Scheme {
	case "unix":
		return nil
	case "https":
		if insecure {
			return fmt.Errorf("%s %q: https with %s; use http:// or drop %s", flag, raw, FlagInsecure, FlagInsecure)
		}
	case "http":
		if !insecure {
			return fmt.Errorf("%s %q: plain http needs %s; use https:// with %s, %s and %s", flag, raw, FlagInsecure, FlagCA, FlagCert, FlagKey)
		}
	default:
		return fmt.Errorf("%s %q: want https://HOST:PORT (or http:// with %s)", flag, raw, FlagInsecure)
	}
	if u.Host == "" || u.Port() == "" {
		return fmt.Errorf("%s %q: want %s://HOST:PORT", flag, raw, u.Scheme)
	}
	return nil
}
