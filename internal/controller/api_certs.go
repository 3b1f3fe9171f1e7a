package controller

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/pki"
	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/topology"
)

// CertRevocation revokes tenant certificates (docs/tenants.md): with
// Serial, the one certificate of that serial number; with Farm alone,
// every certificate of the farm's tenant issued at or before Revoked (to
// the second), which is what a lost key of unknown serial, or the farm's
// delete, needs. The CA keeps no list of what it issued, so a farm's
// revocation is by time, not by name.
type CertRevocation struct {
	Serial  string    `json:"serial,omitempty"`
	Farm    string    `json:"farm,omitempty"`
	Revoked time.Time `json:"revoked"`
	// Expires is the certificate's NotAfter, when the revoker knew it (the
	// CLI's --cert): the record is of no use after it.
	Expires time.Time `json:"expires,omitzero"`
}

func (r CertRevocation) key() string {
	if r.Serial != "" {
		return intent.TenantCertRevocationsPrefix + "serial/" + r.Serial
	}
	return intent.TenantCertRevocationsPrefix + "farm/" + r.Farm
}

// certRevocations is the controller's copy of the revocations, which every
// request with a tenant certificate is checked against; kept like the
// tokens' copy (WatchTenantCredentials).
type certRevocations struct {
	mu       sync.RWMutex
	bySerial map[string]CertRevocation
	byFarm   map[string]CertRevocation
}

// revoked returns the revocation that refuses cert, if one does.
func (r *certRevocations) revoked(cert *x509.Certificate, farm string) (CertRevocation, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if rev, ok := r.bySerial[pki.SerialHex(cert)]; ok {
		return rev, true
	}
	if rev, ok := r.byFarm[farm]; ok && !pki.IssuedAt(cert).After(rev.Revoked) {
		return rev, true
	}
	return CertRevocation{}, false
}

// set applies one key's value (nil: deleted).
func (r *certRevocations) set(key string, val []byte) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.bySerial == nil {
		r.bySerial, r.byFarm = map[string]CertRevocation{}, map[string]CertRevocation{}
	}
	rest := strings.TrimPrefix(key, intent.TenantCertRevocationsPrefix)
	kind, name, _ := strings.Cut(rest, "/")
	if val == nil {
		delete(r.bySerial, name)
		delete(r.byFarm, name)
		return nil
	}
	var rec CertRevocation
	if err := json.Unmarshal(val, &rec); err != nil {
		return fmt.Errorf("certificate revocation %s: %w: ignored", key, err)
	}
	switch {
	case kind == "serial" && rec.Serial == name:
		r.bySerial[name] = rec
	case kind == "farm" && rec.Farm == name && rec.Serial == "":
		r.byFarm[name] = rec
	default:
		return fmt.Errorf("certificate revocation %s: its record names serial %q farm %q: ignored", key, rec.Serial, rec.Farm)
	}
	return nil
}

func (r *certRevocations) reset() {
	r.mu.Lock()
	r.bySerial, r.byFarm = map[string]CertRevocation{}, map[string]CertRevocation{}
	r.mu.Unlock()
}

// setCredential applies one key under intent.TenantsPrefix to the copy
// it belongs to.
func (c *Controller) setCredential(key string, val []byte) error {
	switch {
	case strings.HasPrefix(key, intent.TenantTokensPrefix):
		return c.tokens.set(key, val)
	case strings.HasPrefix(key, intent.TenantCertRevocationsPrefix):
		return c.certRevs.set(key, val)
	}
	return nil
}

// RevokeTenantCert records in: a serial's revocation, or a farm's (every
// certificate of it issued until now). Its Revoked is the controller's
// time. From the moment it returns this controller answers the
// certificates 401; others as soon as their watch sees the record.
func (c *Controller) RevokeTenantCert(ctx context.Context, in CertRevocation) (CertRevocation, error) {
	if in.Farm != "" {
		if err := topology.CheckFarmName(in.Farm); err != nil {
			return in, fieldErr("farm", err)
		}
	}
	switch {
	case in.Serial != "":
		s, err := pki.ParseSerial(in.Serial)
		if err != nil {
			return in, fieldErr("serial", err)
		}
		in.Serial = s
	case in.Farm == "":
		return in, fieldErr("serial", errors.New("missing: name a certificate's serial, or a farm whose certificates issued until now are all revoked"))
	case !in.Expires.IsZero():
		return in, fieldErr("expires", errors.New("only with a serial: a farm's revocation covers certificates of any expiry"))
	}
	in.Revoked = time.Now().UTC()
	val, err := json.Marshal(in)
	if err != nil {
		return in, err
	}
	// The copy first, as a token's revocation: a request racing the write
	// is refused rather than let in.
	if err := c.certRevs.set(in.key(), val); err != nil {
		return in, err
	}
	return in, c.raw.Put(ctx, in.key(), val)
}

// ListCertRevocations lists the revocations (farm's only, if farm is not
// ""), oldest first.
func (c *Controller) ListCertRevocations(ctx context.Context, farm string) ([]CertRevocation, error) {
	recs, _, err := store.ListJSON[CertRevocation](ctx, c.raw, intent.TenantCertRevocationsPrefix)
	if err != nil {
		return nil, err
	}
	out := []CertRevocation{}
	for _, r := range recs {
		if farm == "" || r.Farm == farm {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b CertRevocation) int {
		if n := a.Revoked.Compare(b.Revoked); n != 0 {
			return n
		}
		return strings.Compare(a.key(), b.key())
	})
	return out, nil
}

// revokeFarmCerts revokes every certificate of farm's tenant issued until
// now: a farm's delete does, so a farm made again under its name does not
// take the old tenant's certificates. c.mu is held.
func (c *Controller) revokeFarmCerts(ctx context.Context, farm string) error {
	noteChange(ctx, fmt.Sprintf("revoked farm %s's tenant certificates issued until now", farm))
	if _, err := c.RevokeTenantCert(ctx, CertRevocation{Farm: farm}); err != nil {
		return fmt.Errorf("revoke the tenant certificates of farm %s: %w", farm, err)
	}
	return nil
}
