package controller

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/store"
)

// DefaultAuditKeep is how many audit entries the store keeps unless the
// controller is told otherwise (--audit-keep): the newest, the oldest
// dropped first. An entry is a few hundred bytes, so 10,000 are a few MB.
const DefaultAuditKeep = 10000

// AuditEntry is one write the API made (docs/tenants.md): who made it,
// when, and what it changed. An accepted request's; or a refused one's
// whose writes landed in part before it failed, with the status it was
// answered (every write that lands has its entry).
type AuditEntry struct {
	// ID sorts as the entries were recorded: 16 hex digits of the Unix
	// time in nanoseconds (made to increase) and 4 of a sequence number.
	ID   string    `json:"id"`
	Time time.Time `json:"time"`
	// Who is the identity that acted: "admin (token)", "tenant blue (token ID)", ...
	Who string `json:"who"`
	// Farm is the farm the change concerns; "" for a cloud-wide one.
	Farm   string `json:"farm,omitempty"`
	Method string `json:"method"`
	Path   string `json:"path"` // with its query (?cascade=true)
	// Noun is what was changed (the route's last literal segment: vms,
	// rules, peers, ...) and Name which one (the path's parameters).
	Noun   string `json:"noun"`
	Name   string `json:"name,omitempty"`
	Status int    `json:"status"`
	// Change is the request body, shortened (auditChangeMax) and without
	// any secret: a field named like a secret, token, key or password is
	// written "<redacted>"; then, after "; ", what the write did beyond
	// it (a farm's delete: the tenant tokens it revoked).
	Change string `json:"change,omitempty"`
}

// auditChangeMax is how much of a body an entry keeps.
const auditChangeMax = 240

// auditBodyMax is how much of a body is read to summarise it: a larger one
// is recorded by its size only.
const auditBodyMax = 8 << 10

// auditLog appends entries to the store, one key each under
// intent.AuditPrefix, and drops the oldest beyond keep in the same
// transaction. An API request's entry rides on the request's first write
// (a store.Rider), in its transaction: the write never lands without it,
// and it costs no transaction of its own. An entry that differs, once the
// request is answered, from the one its write carried (another status, a
// change noted after that write) is written again over it; an accepted
// request that wrote nothing is recorded on its own (record).
// It remembers the keys it knows, so an append costs no read;
// every auditRelist appends it counts the keys in the store and relists
// them only if the count is not the one it knows, which finds what another
// controller on the same store appended. (Listing the whole trail, keep
// entries of a few hundred bytes, on the write path took etcd over a
// second at 10,000 entries under load, stalling that write and the store;
// a count is read from etcd's index.) Appends made at once share one
// transaction (a group commit): the first writer commits every entry
// waiting, and each waits for its own, so an entry is in the store before
// its write is answered, at the cost of about one transaction per burst
// of writes rather than one each.
type auditLog struct {
	mu       sync.Mutex
	keep     int // 0: no audit trail
	keys     []string
	loaded   bool
	last     int64 // the last entry's time, ns
	seq      uint16
	since    int // appends since the last list
	pending  []auditWait
	flushing bool
	// status is the status each route last accepted a write with: what
	// an entry written before its request is answered says.
	status map[string]int
}

// auditWait is an entry waiting for its transaction.
type auditWait struct {
	key  string
	val  []byte
	done chan error
}

const auditRelist = 1000

// SetAuditKeep sets how many audit entries are kept (0: none recorded).
func (c *Controller) SetAuditKeep(n int) {
	c.audit.mu.Lock()
	defer c.audit.mu.Unlock()
	c.audit.keep = n
}

// load lists the entries' keys, oldest first.
func (a *auditLog) load(ctx context.Context, s store.Store) error {
	kvs, _, err := s.List(ctx, intent.AuditPrefix)
	if err != nil {
		return fmt.Errorf("audit trail: %w", err)
	}
	a.keys = a.keys[:0]
	for k := range kvs {
		a.keys = append(a.keys, k)
	}
	slices.Sort(a.keys)
	a.loaded, a.since = true, 0
	return nil
}

// check relists the keys if the store holds another number of them than
// the log knows (another controller appended or dropped some), and
// otherwise only starts counting appends again. A store that cannot count
// is relisted.
func (a *auditLog) check(ctx context.Context, s store.Store) error {
	cs, ok := s.(store.Counter)
	if !ok {
		return a.load(ctx, s)
	}
	n, err := cs.Count(ctx, intent.AuditPrefix)
	if err != nil {
		return fmt.Errorf("audit trail: %w", err)
	}
	if n != int64(len(a.keys)) {
		return a.load(ctx, s)
	}
	a.since = 0
	return nil
}

// stamp sets e's ID and Time and returns it as stored. a.mu is held.
func (a *auditLog) stamp(e *AuditEntry) ([]byte, error) {
	now := time.Now()
	ns := now.UnixNano()
	if ns <= a.last {
		ns = a.last + 1
	}
	a.last, a.seq = ns, a.seq+1
	e.ID = fmt.Sprintf("%016x%04x", ns, a.seq)
	e.Time = now.UTC()
	return json.Marshal(e)
}

// known lists or counts the keys in the store when it is time to (the
// first append, every auditRelist). a.mu is held.
func (a *auditLog) known(ctx context.Context, s store.Store) error {
	switch {
	case !a.loaded:
		return a.load(ctx, s)
	case a.since >= auditRelist:
		return a.check(ctx, s)
	}
	return nil
}

// ride returns the writes that append e (its ID and Time set here) in a
// transaction with room for room more: its key, then the oldest beyond
// keep, which are taken from the known keys until settled says how the
// transaction ended. None if the trail is off or there is no room.
func (a *auditLog) ride(ctx context.Context, s store.Store, e *AuditEntry, room int) ([]store.Op, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.keep <= 0 || room < 1 {
		return nil, nil
	}
	if err := a.known(ctx, s); err != nil {
		return nil, err
	}
	val, err := a.stamp(e)
	if err != nil {
		return nil, err
	}
	ops := []store.Op{{Key: intent.AuditPrefix + e.ID, Value: val}}
	drop := min(max(len(a.keys)+1-a.keep, 0), len(a.keys), room-1)
	for _, k := range a.keys[:drop] {
		ops = append(ops, store.Op{Key: k, Delete: true})
	}
	a.keys = a.keys[drop:]
	return ops, nil
}

// settled takes in how the transaction that carried ride's ops ended:
// written, the entry is known; not written (a compare that failed), the
// oldest it would have dropped are known again; an error may have left
// either, so the keys are listed again at the next append.
func (a *auditLog) settled(ops []store.Op, written bool, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch {
	case written:
		a.keys = append(a.keys, ops[0].Key)
		a.since++
	case err != nil:
		a.loaded = false
	default:
		back := make([]string, 0, len(ops)-1+len(a.keys))
		for _, op := range ops[1:] {
			back = append(back, op.Key)
		}
		a.keys = append(back, a.keys...)
	}
}

// expect is the status an entry written before its request is answered
// says: the one the route last accepted a write with, else the usual one
// for the method.
func (a *auditLog) expect(pattern, method string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	if st, ok := a.status[pattern]; ok {
		return st
	}
	switch method {
	case http.MethodPost:
		return http.StatusCreated
	case http.MethodDelete:
		return http.StatusNoContent
	}
	return http.StatusOK
}

// learn remembers the status a route accepted a write with.
func (a *auditLog) learn(pattern string, status int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.status == nil {
		a.status = map[string]int{}
	}
	a.status[pattern] = status
}

// record appends e (its ID and Time set here) and returns once it is in
// the store, the oldest entries beyond keep dropped in the same
// transaction.
func (a *auditLog) record(ctx context.Context, s store.Store, e AuditEntry) error {
	a.mu.Lock()
	if a.keep <= 0 {
		a.mu.Unlock()
		return nil
	}
	val, err := a.stamp(&e)
	if err != nil {
		a.mu.Unlock()
		return err
	}
	w := auditWait{key: intent.AuditPrefix + e.ID, val: val, done: make(chan error, 1)}
	a.pending = append(a.pending, w)
	lead := !a.flushing
	a.flushing = true
	a.mu.Unlock()
	if lead {
		a.flush(context.WithoutCancel(ctx), s)
	}
	return <-w.done
}

// flush commits what is pending, a transaction at a time, until nothing
// is; one caller flushes at a time (a.flushing).
func (a *auditLog) flush(ctx context.Context, s store.Store) {
	for {
		a.mu.Lock()
		if len(a.pending) == 0 {
			a.flushing = false
			a.mu.Unlock()
			return
		}
		err := a.known(ctx, s)
		// Half a transaction for new entries, the rest for the oldest
		// they push out.
		n := min(len(a.pending), store.MaxTxnOps/2)
		batch := slices.Clone(a.pending[:n])
		a.pending = a.pending[n:]
		ops := make([]store.Op, 0, store.MaxTxnOps)
		for _, w := range batch {
			ops = append(ops, store.Op{Key: w.key, Value: w.val})
		}
		drop := min(max(len(a.keys)+n-a.keep, 0), len(a.keys), store.MaxTxnOps-n)
		for _, k := range a.keys[:drop] {
			ops = append(ops, store.Op{Key: k, Delete: true})
		}
		a.mu.Unlock()
		if err == nil {
			err = commit(ctx, s, ops)
		}
		a.mu.Lock()
		if err != nil {
			a.loaded = false // what is there now is unknown: list it next time
			err = fmt.Errorf("audit trail: %w", err)
		} else {
			a.keys = a.keys[drop:]
			for _, w := range batch {
				a.keys = append(a.keys, w.key)
			}
			a.since += n
		}
		a.mu.Unlock()
		for _, w := range batch {
			w.done <- err
		}
	}
}

// commit writes ops in one transaction where the store has them.
func commit(ctx context.Context, s store.Store, ops []store.Op) error {
	if tx, ok := s.(store.Txner); ok {
		_, err := tx.Txn(ctx, ops)
		return err
	}
	for _, op := range ops {
		var err error
		if op.Delete {
			err = s.Delete(ctx, op.Key)
		} else {
			err = s.Put(ctx, op.Key, op.Value)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// Audit lists the audit trail, oldest first: farm's entries only, if farm
// is not "".
func (c *Controller) Audit(ctx context.Context, farm string) ([]AuditEntry, error) {
	all, _, err := store.ListJSON[AuditEntry](ctx, c.raw, intent.AuditPrefix)
	if err != nil {
		return nil, err
	}
	out := make([]AuditEntry, 0, len(all))
	for _, e := range all {
		if farm == "" || e.Farm == farm {
			out = append(out, e)
		}
	}
	slices.SortFunc(out, func(a, b AuditEntry) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// auditRoutes serves the audit trail: an admin's whole, a tenant's farm's.
func (c *Controller) auditRoutes(mux *router) {
	mux.HandleFunc("GET /v1/audit", func(w http.ResponseWriter, r *http.Request) {
		farm := r.URL.Query().Get("farm")
		id := IdentityOf(r.Context())
		if !id.Admin() {
			if err := mayActOn(id, "farm", farm); farm != "" && err != nil {
				reply(w, 0, nil, err)
				return
			}
			farm = id.Farm
		}
		out, err := c.Audit(r.Context(), farm)
		reply(w, http.StatusOK, out, err)
	})
}

// auditNote is what a handler adds to its request's entry: the farm a
// write concerns when its path does not name one (a farm's creation, a
// TAP policy, a tenant token), and what the write did beyond its body (a
// farm's delete revoking its tokens).
type auditNote struct{ farm, change string }

type auditNoteKey struct{}

// noteFarm records, for the audit trail, the farm the request's write
// concerns; a request that is not audited ignores it.
func noteFarm(ctx context.Context, farm string) {
	if n, ok := ctx.Value(auditNoteKey{}).(*auditNote); ok {
		n.farm = farm
	}
}

// noteChange records, for the audit trail, something the request's write
// did that its body does not say; it goes after the body in the entry's
// change.
func noteChange(ctx context.Context, change string) {
	if n, ok := ctx.Value(auditNoteKey{}).(*auditNote); ok {
		n.change = strings.TrimPrefix(n.change+"; "+change, "; ")
	}
}

// statusWriter remembers the status a handler answered.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// teeBody keeps the first auditBodyMax bytes a handler reads of a body.
type teeBody struct {
	io.ReadCloser
	buf  bytes.Buffer
	read int
}

func (t *teeBody) Read(p []byte) (int, error) {
	n, err := t.ReadCloser.Read(p)
	if room := auditBodyMax - t.buf.Len(); room > 0 {
		t.buf.Write(p[:min(n, room)])
	}
	t.read += n
	return n, err
}

// audited runs a write's handler and records it: its entry rides on the
// handler's first write (auditLog), so it is in the store before the
// answer is complete and a client that has its answer finds its write in
// the trail. A request that wrote nothing is recorded if it was accepted
// (2xx).
func (c *Controller) audited(w http.ResponseWriter, r *http.Request, pattern string, id Identity, h http.Handler) {
	c.audit.mu.Lock()
	off := c.audit.keep <= 0
	c.audit.mu.Unlock()
	if off {
		h.ServeHTTP(w, r)
		return
	}
	note := &auditNote{farm: r.PathValue("farm")}
	var body *teeBody
	if r.Body != nil && r.Body != http.NoBody {
		body = &teeBody{ReadCloser: r.Body}
		r.Body = body
	}
	noun, name := nounAndName(pattern, r)
	entry := func(status int) AuditEntry {
		e := AuditEntry{Who: id.String(), Farm: note.farm, Method: r.Method, Path: r.URL.RequestURI(),
			Noun: noun, Name: name, Status: status}
		if body != nil {
			e.Change = summarize(body.buf.Bytes(), body.read)
		}
		if note.change != "" {
			e.Change = strings.TrimPrefix(e.Change+"; "+note.change, "; ")
		}
		return e
	}
	var carried AuditEntry // as the handler's write carried it
	rider := store.NewRider(func(room int) ([]store.Op, error) {
		carried = entry(c.audit.expect(pattern, r.Method))
		return c.audit.ride(r.Context(), c.raw, &carried, room)
	}, c.audit.settled)
	ctx := store.WithRider(context.WithValue(r.Context(), auditNoteKey{}, note), rider)
	sw := &statusWriter{ResponseWriter: w}
	h.ServeHTTP(sw, r.WithContext(ctx))
	wrote := rider.Close()
	accepted := sw.status >= 200 && sw.status <= 299
	if accepted {
		c.audit.learn(pattern, sw.status)
	}
	e := entry(sw.status)
	var err error
	switch {
	case wrote:
		e.ID, e.Time = carried.ID, carried.Time
		if e == carried {
			return
		}
		// What the write carried is not all the request did: the entry
		// says it all, over it.
		var val []byte
		if val, err = json.Marshal(e); err == nil {
			err = c.raw.Put(r.Context(), intent.AuditPrefix+e.ID, val)
		}
	case accepted:
		err = c.audit.record(r.Context(), c.raw, e)
	}
	if err != nil {
		c.log.Error("audit trail: an accepted write is not recorded", "who", e.Who, "method", e.Method, "path", e.Path, "err", err)
	}
}

// nounAndName are a route's last literal path segment and the values of
// its parameters, joined by "/": (vms, blue/web/web1).
func nounAndName(pattern string, r *http.Request) (string, string) {
	_, path, _ := strings.Cut(pattern, " ")
	var noun string
	var names []string
	for _, seg := range strings.Split(path, "/") {
		if p, ok := strings.CutPrefix(seg, "{"); ok {
			names = append(names, r.PathValue(strings.TrimSuffix(strings.TrimSuffix(p, "}"), "...")))
		} else if seg != "" && seg != "v1" {
			noun = seg
		}
	}
	return noun, strings.Join(names, "/")
}

// secretField reports whether a JSON field's name says it holds a secret.
func secretField(name string) bool {
	n := strings.ToLower(name)
	for _, s := range []string{"secret", "token", "key", "password", "passwd"} {
		if strings.Contains(n, s) {
			return true
		}
	}
	return false
}

// summarize is a body as an entry keeps it: compact JSON with secret
// fields redacted, at most auditChangeMax bytes; a body larger than what
// was kept of it (auditBodyMax), or not JSON, by its size only.
func summarize(kept []byte, size int) string {
	if size == 0 {
		return ""
	}
	var v any
	if size > len(kept) || json.Unmarshal(kept, &v) != nil {
		return fmt.Sprintf("(%d bytes)", size)
	}
	b, err := json.Marshal(redact(v))
	if err != nil {
		return fmt.Sprintf("(%d bytes)", size)
	}
	if len(b) > auditChangeMax {
		return string(b[:auditChangeMax-3]) + "..."
	}
	return string(b)
}

func redact(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if secretField(k) {
				x[k] = "<redacted>"
			} else {
				x[k] = redact(e)
			}
		}
	case []any:
		for i, e := range x {
			x[i] = redact(e)
		}
	}
	return v
}
