package controller

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
)

// TenantToken is a bearer token scoped to one farm (docs/tenants.md), as
// the API lists it: never its secret, which is shown once, at creation.
type TenantToken struct {
	ID      string    `json:"id"`
	Farm    string    `json:"farm"`
	Created time.Time `json:"created"`
}

// NewTenantToken is what creating a token answers: the record and, this
// once, the token itself.
type NewTenantToken struct {
	TenantToken
	Token string `json:"token"`
}

// tokenRecord is what the store keeps of a token: the SHA-256 of the whole
// token, not the token. A fast hash is enough: a token is 256 random bits,
// which no dictionary holds and no search finds, and it is checked on
// every request.
type tokenRecord struct {
	TenantToken
	Hash string `json:"sha256"`
}

func tokenKey(id string) string { return intent.TenantTokensPrefix + id }

// hashToken is the hex SHA-256 a token is stored and looked up by.
func hashToken(tok string) string {
	h := sha256.Sum256([]byte(tok))
	return hex.EncodeToString(h[:])
}

// tenantTokens is the controller's copy of the tokens, which every request
// is checked against: written through by this controller's own creates and
// revokes, and kept to the store's by a watch (WatchTenantCredentials), so that
// a token revoked through another controller is refused here at once too.
type tenantTokens struct {
	mu     sync.RWMutex
	byHash map[string]TenantToken
	byKey  map[string]string // store key -> hash
}

func (t *tenantTokens) lookup(tok string) (TenantToken, bool) {
	h := hashToken(tok)
	t.mu.RLock()
	defer t.mu.RUnlock()
	rec, ok := t.byHash[h]
	return rec, ok
}

// set applies one key's value (nil: deleted).
func (t *tenantTokens) set(key string, val []byte) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.byHash == nil {
		t.byHash, t.byKey = map[string]TenantToken{}, map[string]string{}
	}
	if old, ok := t.byKey[key]; ok {
		delete(t.byHash, old)
		delete(t.byKey, key)
	}
	if val == nil {
		return nil
	}
	var rec tokenRecord
	if err := json.Unmarshal(val, &rec); err != nil || len(rec.Hash) != 2*sha256.Size || rec.Farm == "" {
		return fmt.Errorf("tenant token %s: not a token record (%v): ignored", key, err)
	}
	t.byHash[rec.Hash], t.byKey[key] = rec.TenantToken, rec.Hash
	return nil
}

// replace makes the copy exactly kvs.
func (t *tenantTokens) replace(kvs map[string][]byte) []error {
	t.mu.Lock()
	t.byHash, t.byKey = map[string]TenantToken{}, map[string]string{}
	t.mu.Unlock()
	var errs []error
	for k, v := range kvs {
		if err := t.set(k, v); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// LoadTenantCredentials reads every tenant token and certificate
// revocation into the controller's copies and returns the revision it read
// at, for WatchTenantCredentials. The daemon calls it before it serves the
// API, so no token is refused for not being loaded, and no revoked
// certificate let in.
func (c *Controller) LoadTenantCredentials(ctx context.Context) (int64, error) {
	kvs, rev, err := c.raw.List(ctx, intent.TenantsPrefix)
	if err != nil {
		return 0, fmt.Errorf("load tenant credentials: %w", err)
	}
	toks := map[string][]byte{}
	c.certRevs.reset()
	for k, v := range kvs {
		if strings.HasPrefix(k, intent.TenantTokensPrefix) {
			toks[k] = v
		} else if err := c.setCredential(k, v); err != nil {
			c.log.Warn("tenant credentials", "err", err)
		}
	}
	for _, err := range c.tokens.replace(toks) {
		c.log.Warn("tenant tokens", "err", err)
	}
	return rev, nil
}

// WatchTenantCredentials keeps the controller's copies of the tokens and
// certificate revocations equal to the store's from revision rev until ctx
// ends: a broken watch relists, and watches on from the revision of that
// list.
func (c *Controller) WatchTenantCredentials(ctx context.Context, rev int64) {
	for ctx.Err() == nil {
		for b := range c.raw.WatchEvents(ctx, intent.TenantsPrefix, rev) {
			if b.Err != nil {
				break
			}
			for _, ev := range b.Events {
				val := ev.Value
				if ev.Deleted {
					val = nil
				}
				if err := c.setCredential(ev.Key, val); err != nil {
					c.log.Warn("tenant credentials", "err", err)
				}
			}
		}
		if ctx.Err() != nil {
			return
		}
		var err error
		if rev, err = c.LoadTenantCredentials(ctx); err != nil {
			c.log.Warn("tenant credentials: relist after a broken watch; retrying in 1s", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
}

// tenantRoutes serves tenant tokens and certificate revocations: an
// admin's operations only.
func (c *Controller) tenantRoutes(mux *router) {
	mux.HandleFunc("GET /v1/tenants/tokens", func(w http.ResponseWriter, r *http.Request) {
		out, err := c.ListTenantTokens(r.Context(), r.URL.Query().Get("farm"))
		reply(w, http.StatusOK, out, err)
	})
	mux.HandleFunc("POST /v1/tenants/tokens", func(w http.ResponseWriter, r *http.Request) {
		var in struct {
			Farm string `json:"farm"`
		}
		if decode(w, r, &in) {
			noteFarm(r.Context(), in.Farm)
			out, err := c.CreateTenantToken(r.Context(), in.Farm)
			reply(w, http.StatusCreated, out, err)
		}
	})
	mux.HandleFunc("DELETE /v1/tenants/tokens/{id}", func(w http.ResponseWriter, r *http.Request) {
		_, err := c.RevokeTenantToken(r.Context(), r.PathValue("id"))
		reply(w, http.StatusNoContent, nil, err)
	})
	// Tenant certificates' revocations (api_certs.go).
	mux.HandleFunc("GET /v1/tenants/cert-revocations", func(w http.ResponseWriter, r *http.Request) {
		out, err := c.ListCertRevocations(r.Context(), r.URL.Query().Get("farm"))
		reply(w, http.StatusOK, out, err)
	})
	mux.HandleFunc("POST /v1/tenants/cert-revocations", func(w http.ResponseWriter, r *http.Request) {
		var in CertRevocation
		if decode(w, r, &in) {
			noteFarm(r.Context(), in.Farm)
			out, err := c.RevokeTenantCert(r.Context(), in)
			reply(w, http.StatusCreated, out, err)
		}
	})
}

// CreateTenantToken makes a token for farm's tenant (the farm must exist)
// and returns it: the only time the secret is seen. The store keeps its
// hash.
func (c *Controller) CreateTenantToken(ctx context.Context, farm string) (NewTenantToken, error) {
	// Under the intent lock, as a farm's delete is: a token made while
	// its farm is being deleted would outlive it.
	c.mu.Lock()
	defer c.mu.Unlock()
	if farm == "" {
		return NewTenantToken{}, fieldErr("farm", errors.New("missing: a tenant token is scoped to one farm"))
	}
	if _, err := c.getFarm(ctx, farm); errors.Is(err, ErrNotFound) {
		return NewTenantToken{}, fieldErr("farm", fmt.Errorf("no farm %q: create it first (onehop farm create %s)", farm, farm))
	} else if err != nil {
		return NewTenantToken{}, err
	}
	b := make([]byte, 8+32)
	if _, err := rand.Read(b); err != nil {
		return NewTenantToken{}, fmt.Errorf("generate token: %w", err)
	}
	id := hex.EncodeToString(b[:8])
	// The id is part of the token, so that one found in a file or a log
	// names the record to revoke.
	tok := "oht." + id + "." + hex.EncodeToString(b[8:])
	rec := tokenRecord{TenantToken: TenantToken{ID: id, Farm: farm, Created: time.Now().UTC().Truncate(time.Second)}, Hash: hashToken(tok)}
	val, err := json.Marshal(rec)
	if err != nil {
		return NewTenantToken{}, err
	}
	if err := c.raw.Put(ctx, tokenKey(id), val); err != nil {
		return NewTenantToken{}, err
	}
	if err := c.tokens.set(tokenKey(id), val); err != nil {
		return NewTenantToken{}, err
	}
	return NewTenantToken{TenantToken: rec.TenantToken, Token: tok}, nil
}

// ListTenantTokens lists the tokens (farm's only, if farm is not ""),
// oldest first, without their secrets or hashes.
func (c *Controller) ListTenantTokens(ctx context.Context, farm string) ([]TenantToken, error) {
	recs, _, err := store.ListJSON[tokenRecord](ctx, c.raw, intent.TenantTokensPrefix)
	if err != nil {
		return nil, err
	}
	out := []TenantToken{}
	for _, r := range recs {
		if farm == "" || r.Farm == farm {
			out = append(out, r.TenantToken)
		}
	}
	slices.SortFunc(out, func(a, b TenantToken) int {
		if n := a.Created.Compare(b.Created); n != 0 {
			return n
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out, nil
}

// RevokeTenantToken deletes token id; from the moment it returns, this
// controller answers the token 401 (others as soon as their watch sees the
// deletion).
func (c *Controller) RevokeTenantToken(ctx context.Context, id string) (TenantToken, error) {
	var rec tokenRecord
	if err := store.GetJSON(ctx, c.raw, tokenKey(id), &rec); errors.Is(err, store.ErrNotFound) {
		return TenantToken{}, notFound("id", "tenant token %s", id)
	} else if err != nil {
		return TenantToken{}, err
	}
	// Before the delete, which carries the request's audit entry.
	noteFarm(ctx, rec.Farm)
	// The copy first: a request that races the delete is refused rather
	// than let in by a token the operator has already revoked.
	if err := c.tokens.set(tokenKey(id), nil); err != nil {
		return rec.TenantToken, err
	}
	return rec.TenantToken, c.raw.Delete(ctx, tokenKey(id))
}

// auditTokensNamed bounds the ids an audit entry names of the tokens a
// farm's delete revoked: the entry stays a few hundred bytes.
const auditTokensNamed = 8

// revokeFarmTokens revokes every tenant token of farm, as
// RevokeTenantToken does each, and notes their ids for the audit entry of
// the request that caused it (a farm's delete, or its creation finding
// tokens of a farm of that name deleted before). c.mu is held.
func (c *Controller) revokeFarmTokens(ctx context.Context, farm string) error {
	toks, err := c.ListTenantTokens(ctx, farm)
	if err != nil {
		return fmt.Errorf("tenant tokens of farm %s: %w", farm, err)
	}
	if len(toks) == 0 {
		return nil
	}
	ids := make([]string, len(toks))
	for i, t := range toks {
		ids[i] = t.ID
	}
	// Noted before the first revocation, whose write carries the entry.
	named := strings.Join(ids[:min(len(ids), auditTokensNamed)], " ")
	if len(ids) > auditTokensNamed {
		named += fmt.Sprintf(" and %d more", len(ids)-auditTokensNamed)
	}
	noteChange(ctx, fmt.Sprintf("revoked farm %s's tenant tokens: %s", farm, named))
	for _, t := range toks {
		if _, err := c.RevokeTenantToken(ctx, t.ID); err != nil && !errors.Is(err, ErrNotFound) {
			return fmt.Errorf("revoke tenant token %s of farm %s: %w", t.ID, farm, err)
		}
	}
	c.log.Info("tenant tokens revoked with their farm", "farm", farm, "tokens", ids)
	return nil
}
