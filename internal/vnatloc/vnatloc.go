// Package vnatloc is the VNAT location server (paper 001_fcb5a695fe7df1bc,
// §3.3.2.1: the last resort of a moved end's locate walk), as the controller
// runs it: it answers VCMP_LOC_QUERY and VCMP_LOC_STORE, keeps its records
// in the store (etcd) under Prefix, lets them expire, and decides who may
// write a record. docs/vnat-location.md says why each rule is what it is.
//
// The rules, in short:
//
//   - a record lives vcmp.RecordLifetime after it was last stored; the end
//     refreshes the records it still needs, an expired one is gone;
//   - a record is stored only at the address it names: L_Phys_Addr must be
//     the address the VCMP stream comes from (a TCP stream proves its
//     source can receive there);
//   - first writer wins until expiry: a live record is refreshed, moved or
//     released only from the address that wrote it;
//   - a virtual address in the tenant space (10.0.0.0/8) is stored only by a
//     source of the same farm (10.F.x.x), and any other virtual address only
//     by a source outside the tenant space: an external never held a VM's
//     address, and a VM never leaves its farm;
//   - every field is checked, and a source holds at most MaxPerSource
//     records and MaxHeldPerSource virtual addresses away from where it is;
//   - a tenant virtual address away from where the end is is claimed only
//     by its holder, as intent (Config.Holder) and the records say: no VM
//     squats an address it never held;
//   - a stream speaks for a VM (VCMP_RELAY) only on the agents'
//     authenticated channel (TLS with a client certificate of the cluster's
//     CA whose CN is the VM's host), never by its source address.
//
// Records whose end is away from its virtual address are what Held reports:
// the controller hands none of those addresses out (§3.4.2).
package vnatloc

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/onehop/onehop/internal/accept"
	"github.com/onehop/onehop/internal/addrplan"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/ratelog"
	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/vcmp"
)

// Prefix is where location records live in the store: one key per record,
// Prefix + "PROTO/LOCAL/REMOTE" (virtual endpoints, ADDR:PORT), holding a
// Stored as JSON. It is under the store's root but not under its intent/
// prefix: a refresh is not an intent change and recompiles nothing.
const Prefix = intent.VNATLocationsPrefix

// Limits of one server; zero fields of Config take these.
const (
	// MaxRecords caps the records the server keeps.
	MaxRecords = 65536
	// MaxPerSource caps the records one source address may hold.
	MaxPerSource = 4096
	// MaxHeldPerSource caps the virtual addresses one source address may
	// hold away from itself (each one is an address the controller will not
	// hand out, so this bounds what a misbehaving end can take from its
	// farm's allocator).
	MaxHeldPerSource = 16
)

// Stored is one record as the store holds it.
type Stored struct {
	Proto  string `json:"proto"`  // tcp or udp
	Local  string `json:"local"`  // the end's virtual endpoint, ADDR:PORT
	Remote string `json:"remote"` // its peer's virtual endpoint
	Phys   string `json:"phys"`   // where the end is now, ADDR:PORT
	Owner  string `json:"owner"`  // who wrote it: Identity of the source
	// Expires is when the record stops answering (RFC 3339, UTC).
	Expires time.Time `json:"expires"`
}

// Config tunes a Service; the zero value is the defaults.
type Config struct {
	Lifetime         time.Duration // 0: vcmp.RecordLifetime
	MaxRecords       int           // 0: MaxRecords
	MaxPerSource     int           // 0: MaxPerSource
	MaxHeldPerSource int           // 0: MaxHeldPerSource
	Now              func() time.Time
	Logger           *slog.Logger
	// Identity names who a source address is, for ownership: a record is
	// refreshed, moved or released only by the identity that wrote it. The
	// controller names a VM by its farm and name from intent, so a VM that
	// moved again still owns what it stored from its previous address; nil,
	// or an empty name, is "addr:" + the address (an external's identity is
	// its address).
	Identity func(ctx context.Context, source netip.Addr) (string, error)
	// RelayTLS is the agents' authenticated channel: a stream that starts
	// a TLS handshake is served with it, and only such a stream may relay
	// (VCMP_RELAY). Its ClientCAs must be the cluster's CA; New makes it
	// require and verify a client certificate whatever ClientAuth says.
	// Nil: no relay is taken (a source address proves nothing: slivers
	// share their host's).
	RelayTLS *tls.Config
	// RelayAllowed says whether the agent of node (its certificate's CN)
	// may relay streams of source (a VM): the controller answers from
	// intent, true when the VM is placed on node. Nil: no relays.
	RelayAllowed func(ctx context.Context, node string, source netip.Addr) (bool, error)
	// Holder names who holds a tenant-space virtual address by intent
	// (Identity's names): a record that claims one away from where its
	// end is (L_Vir ≠ the source) is stored only for its holder
	// (docs/vnat-location.md, rule 6). Nil: intent is not asked, and only
	// the records say.
	Holder func(ctx context.Context, virtual netip.Addr) (Holders, error)
	// Index is the held-address index the controller allocates with: the
	// server applies its own writes to it as soon as they are committed,
	// so an allocation after a store was answered sees the record even
	// before the index's watch brings it. Nil: none.
	Index *HeldIndex
	// MaxTxnOps caps the writes of one store transaction (the records of a
	// VCMP batch are written a transaction at a time); 0: store.MaxTxnOps.
	MaxTxnOps int
	// Streams bound the streams Serve takes at once, per source and in
	// all, and how long one may sit idle; zero fields: DefaultStreamLimits.
	Streams accept.Limits
	// Listeners counts Serve's listener as "location" (onehop_listener_*
	// on the controller's /metrics); nil: the service's own.
	Listeners *accept.Stats
}

// Holders are who holds a virtual address by intent: Now, the VM it is
// given to ("" for none), and Before, the VMs that had it before they
// moved to another subnet.
type Holders struct {
	Now    string
	Before []string
}

type entry struct {
	phys    netip.AddrPort
	owner   string // Identity of the source that wrote it
	expires time.Time
}

// Service is the location server's state: an index of the live records,
// written through to the store. One process serves (the controller), so the
// index is the truth between loads; the store makes it outlive a restart
// and lets others read it (Held).
type Service struct {
	cfg   Config
	store store.Store
	rlog  *ratelog.Logger
	log   *slog.Logger

	mu       sync.Mutex
	recs     map[vcmp.Tuple]entry
	bySource map[string]map[vcmp.Tuple]bool // by owner
	counters map[string]uint64
}

// New is a service over s; call Load before serving.
func New(s store.Store, cfg Config) *Service {
	if cfg.Lifetime <= 0 {
		cfg.Lifetime = vcmp.RecordLifetime
	}
	if cfg.MaxRecords <= 0 {
		cfg.MaxRecords = MaxRecords
	}
	if cfg.MaxPerSource <= 0 {
		cfg.MaxPerSource = MaxPerSource
	}
	if cfg.MaxHeldPerSource <= 0 {
		cfg.MaxHeldPerSource = MaxHeldPerSource
	}
	if cfg.MaxTxnOps <= 0 {
		cfg.MaxTxnOps = store.MaxTxnOps
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	cfg.Streams = cfg.Streams.Or(DefaultStreamLimits)
	if cfg.RelayTLS != nil && cfg.RelayTLS.ClientAuth != tls.RequireAndVerifyClientCert {
		cfg.RelayTLS = cfg.RelayTLS.Clone()
		cfg.RelayTLS.ClientAuth = tls.RequireAndVerifyClientCert
	}
	if cfg.Listeners == nil {
		cfg.Listeners = accept.NewStats(nil)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Service{cfg: cfg, store: s, log: cfg.Logger, rlog: ratelog.New(cfg.Logger, 1, time.Second, cfg.Now),
		recs: map[vcmp.Tuple]entry{}, bySource: map[string]map[vcmp.Tuple]bool{}, counters: map[string]uint64{}}
}

// Key is the store key of the record of the end conn.Local.
func Key(conn vcmp.Tuple) string {
	return Prefix + conn.Proto.String() + "/" + conn.Local.String() + "/" + conn.Remote.String()
}

// parse reads a stored record back; it refuses what the server would never
// have written.
func parse(b []byte) (vcmp.Tuple, entry, error) {
	var s Stored
	if err := json.Unmarshal(b, &s); err != nil {
		return vcmp.Tuple{}, entry{}, err
	}
	var t vcmp.Tuple
	switch s.Proto {
	case "tcp":
		t.Proto = vcmp.TCP
	case "udp":
		t.Proto = vcmp.UDP
	default:
		return t, entry{}, fmt.Errorf("proto %q", s.Proto)
	}
	var e entry
	var err error
	if t.Local, err = netip.ParseAddrPort(s.Local); err != nil {
		return t, e, fmt.Errorf("local: %w", err)
	}
	if t.Remote, err = netip.ParseAddrPort(s.Remote); err != nil {
		return t, e, fmt.Errorf("remote: %w", err)
	}
	if e.phys, err = netip.ParseAddrPort(s.Phys); err != nil {
		return t, e, fmt.Errorf("phys: %w", err)
	}
	if e.owner = s.Owner; e.owner == "" {
		return t, e, errors.New("no owner")
	}
	e.expires = s.Expires
	return t, e, nil
}

// Load reads the live records from the store into the index; expired or
// unreadable ones are deleted.
func (s *Service) Load(ctx context.Context) error {
	kvs, _, err := s.store.List(ctx, Prefix)
	if err != nil {
		return fmt.Errorf("vnat locations: load: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.cfg.Now()
	var errs []error
	for k, b := range kvs {
		t, e, err := parse(b)
		if err != nil || Key(t) != k || !now.Before(e.expires) {
			if err != nil {
				s.log.Warn("vnat locations: unreadable record deleted", "key", k, "err", err)
			}
			errs = append(errs, s.store.Delete(ctx, k))
			continue
		}
		s.index(t, e)
	}
	return errors.Join(errs...)
}

func (s *Service) index(t vcmp.Tuple, e entry) {
	if old, ok := s.recs[t]; ok {
		s.unindexSource(old.owner, t)
	}
	s.recs[t] = e
	m := s.bySource[e.owner]
	if m == nil {
		m = map[vcmp.Tuple]bool{}
		s.bySource[e.owner] = m
	}
	m[t] = true
}

func (s *Service) unindexSource(owner string, t vcmp.Tuple) {
	if m := s.bySource[owner]; m != nil {
		delete(m, t)
		if len(m) == 0 {
			delete(s.bySource, owner)
		}
	}
}

func (s *Service) unindex(t vcmp.Tuple) {
	if e, ok := s.recs[t]; ok {
		s.unindexSource(e.owner, t)
		delete(s.recs, t)
	}
}

// live is the live record of the end t.Local, dropping an expired one.
func (s *Service) live(ctx context.Context, t vcmp.Tuple) (entry, bool) {
	e, ok := s.recs[t]
	if !ok {
		return entry{}, false
	}
	if !s.cfg.Now().Before(e.expires) {
		s.unindex(t)
		if err := s.store.Delete(ctx, Key(t)); err != nil {
			s.log.Error("vnat locations: delete expired record", "conn", t, "err", err)
		}
		s.counters["expired"]++
		return entry{}, false
	}
	return e, true
}

// Sweep deletes every expired record and returns how many it deleted.
func (s *Service) Sweep(ctx context.Context) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.cfg.Now()
	n := 0
	var errs []error
	for t, e := range s.recs {
		if now.Before(e.expires) {
			continue
		}
		s.unindex(t)
		errs = append(errs, s.store.Delete(ctx, Key(t)))
		s.counters["expired"]++
		n++
	}
	return n, errors.Join(errs...)
}

// Len is the number of records in the index (live or not yet swept).
func (s *Service) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.recs)
}

// Counters are the service's counts (answers by status, refusals by
// reason, expiries), a copy.
func (s *Service) Counters() map[string]uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]uint64, len(s.counters))
	for k, v := range s.counters {
		out[k] = v
	}
	return out
}

// Events are every count the server keeps besides refusals (Counters).
var Events = []string{"stored", "refreshed", "released", "expired", "relayed_streams", "bad_messages", "store_errors",
	"answered_found", "answered_stored", "answered_not_found", "answered_refused"}

// RefusalReasons are every reason the server counts a refusal under
// (Counters' "refused_" + reason).
var RefusalReasons = []string{"invalid", "source", "space", "holder", "owner", "full", "source_full", "held_full", "command", "relay"}

// refuse counts a refusal and logs it at most once a second per reason.
// Called with s.mu held.
func (s *Service) refuse(reason, msg string, args ...any) {
	s.counters["refused_"+reason]++
	s.rlog.Warn(reason, "vnat location server: "+msg, append(args, "reason", reason)...)
}

// inTenant reports whether a is in the tenant space: the cloud's address
// plan's prefix (addrplan; 10.0.0.0/8 by default).
func inTenant(a netip.Addr) bool { return addrplan.Current().Contains(a) }

// endpointErr says what is wrong with an endpoint a record names; "" when
// nothing is. A connection's ends are unicast IPv4 with a port.
func endpointErr(ap netip.AddrPort) string {
	a := ap.Addr()
	switch {
	case !a.Is4():
		return "not IPv4"
	case a.IsUnspecified() || a.As4()[0] == 0:
		return "in 0.0.0.0/8 (this network)"
	case a.IsLoopback():
		return "a loopback address"
	case a.IsMulticast():
		return "a multicast address"
	case a == netip.AddrFrom4([4]byte{255, 255, 255, 255}) || a.As4()[0] >= 240:
		return "a broadcast or reserved (240.0.0.0/4) address"
	case a.IsLinkLocalUnicast():
		return "a link-local address (169.254.0.0/16)"
	case ap.Port() == 0:
		return "port 0"
	}
	return ""
}

// checkRecord refuses a record no real connection would send: reason and
// detail, or "" when it is well-formed. phys is checked unless release.
func checkRecord(r vcmp.Record, release bool) (reason, detail string) {
	for _, f := range []struct {
		name string
		ap   netip.AddrPort
	}{{"L_Vir", r.Conn.Local}, {"R_Vir", r.Conn.Remote}, {"L_Phys", r.Phys}} {
		if release && f.name == "L_Phys" {
			continue
		}
		if e := endpointErr(f.ap); e != "" {
			return "invalid", fmt.Sprintf("%s %v is %s", f.name, f.ap, e)
		}
	}
	if r.Conn.Local == r.Conn.Remote {
		return "invalid", fmt.Sprintf("L_Vir and R_Vir are both %v", r.Conn.Local)
	}
	return "", ""
}

// sameSpace: a virtual address in the tenant space is held only by a source
// of the same farm (a VM moves only within its farm), any other only by a
// source outside the tenant space.
func sameSpace(virtual, source netip.Addr) bool {
	vt, st := inTenant(virtual), inTenant(source)
	if vt != st {
		return false
	}
	return !vt || virtual.As4()[1] == source.As4()[1]
}

// heldBy is the number of distinct virtual addresses source holds away from
// itself, with extra (a record being added) counted too.
func (s *Service) heldBy(source string, extra vcmp.Tuple, extraPhys netip.AddrPort) int {
	held := map[netip.Addr]bool{}
	for t := range s.bySource[source] {
		if e := s.recs[t]; t.Local.Addr() != e.phys.Addr() {
			held[t.Local.Addr()] = true
		}
	}
	if extra.Local.Addr() != extraPhys.Addr() {
		held[extra.Local.Addr()] = true
	}
	return len(held)
}

// identity is Config.Identity, or the address.
func (s *Service) identity(ctx context.Context, from netip.Addr) (string, error) {
	if s.cfg.Identity != nil {
		who, err := s.cfg.Identity(ctx, from)
		if err != nil {
			return "", fmt.Errorf("vnat locations: who is %s: %w", from, err)
		}
		if who != "" {
			return who, nil
		}
	}
	return "addr:" + from.String(), nil
}

// claim refuses a record that claims a virtual address for who that is
// not who's: "" when who may claim virtual, else the refusal's reason. An
// end at its virtual address (virtual is from) claims where it is; away
// from it, a tenant address is who's if intent gives it to who now, or if
// no VM has it now and who had it before a move (Config.Holder), or who
// holds live records of it already (a VM that moved twice). Called with
// s.mu held.
func (s *Service) claim(ctx context.Context, who string, virtual, from netip.Addr) (string, error) {
	if virtual == from || !inTenant(virtual) {
		return "", nil
	}
	var h Holders
	if s.cfg.Holder != nil {
		var err error
		if h, err = s.cfg.Holder(ctx, virtual); err != nil {
			return "identity", fmt.Errorf("vnat locations: who holds %s: %w", virtual, err)
		}
	}
	switch {
	case h.Now == who:
		return "", nil
	case h.Now != "":
		s.refuse("holder", "record claims a virtual address another VM holds", "from", from, "who", who, "virtual", virtual, "holder", h.Now)
		return "holder", nil
	case slices.Contains(h.Before, who):
		return "", nil
	}
	for t := range s.bySource[who] {
		if t.Local.Addr() == virtual && s.cfg.Now().Before(s.recs[t].expires) {
			return "", nil
		}
	}
	if s.cfg.Holder == nil {
		return "", nil // no intent to ask: nobody is known to hold it
	}
	s.refuse("holder", "record claims a virtual address its source never held", "from", from, "who", who, "virtual", virtual)
	return "holder", nil
}

// put decides whether from may store r and stores it: "" or the refusal's
// reason. Called with s.mu held.
func (s *Service) put(ctx context.Context, b *batch, r vcmp.Record, from netip.Addr) (string, error) {
	s.room(ctx, b, Key(r.Conn))
	if reason, detail := checkRecord(r, false); reason != "" {
		s.refuse(reason, "malformed record", "from", from, "conn", r.Conn, "detail", detail)
		return reason, nil
	}
	if r.Phys.Addr() != from {
		s.refuse("source", "record stored from elsewhere than the location it names", "from", from, "conn", r.Conn, "phys", r.Phys)
		return "source", nil
	}
	if !sameSpace(r.Conn.Local.Addr(), from) {
		s.refuse("space", "virtual address outside the source's space (tenant farm or fabric)", "from", from, "conn", r.Conn)
		return "space", nil
	}
	who, err := s.identity(ctx, from)
	if err != nil {
		return "identity", err
	}
	if reason, err := s.claim(ctx, who, r.Conn.Local.Addr(), from); reason != "" || err != nil {
		return reason, err
	}
	cur, exists := s.live(ctx, r.Conn)
	if exists && cur.owner != who {
		s.refuse("owner", "record held by another source until it expires", "from", from, "who", who, "conn", r.Conn, "owner", cur.owner)
		return "owner", nil
	}
	if !exists {
		switch {
		case len(s.recs) >= s.cfg.MaxRecords:
			s.refuse("full", "location server full", "from", from, "records", len(s.recs))
			return "full", nil
		case len(s.bySource[who]) >= s.cfg.MaxPerSource:
			s.refuse("source_full", "source holds as many records as it may", "from", from, "who", who, "records", len(s.bySource[who]))
			return "source_full", nil
		}
	}
	if n := s.heldBy(who, r.Conn, r.Phys); n > s.cfg.MaxHeldPerSource {
		s.refuse("held_full", "source holds as many virtual addresses as it may", "from", from, "conn", r.Conn, "max", s.cfg.MaxHeldPerSource)
		return "held_full", nil
	}
	e := entry{phys: r.Phys, owner: who, expires: s.cfg.Now().Add(s.cfg.Lifetime)}
	js, err := json.Marshal(Stored{Proto: r.Conn.Proto.String(), Local: r.Conn.Local.String(), Remote: r.Conn.Remote.String(),
		Phys: r.Phys.String(), Owner: who, Expires: e.expires.UTC()})
	if err != nil {
		return "store", err
	}
	counter := "stored"
	if exists {
		counter = "refreshed"
	}
	s.stage(b, r.Conn, store.Op{Key: Key(r.Conn), Value: js}, &e, counter)
	return "", nil
}

// release withdraws from's record for conn: "" or the refusal's reason.
// Called with s.mu held.
func (s *Service) release(ctx context.Context, b *batch, r vcmp.Record, from netip.Addr) (string, error) {
	s.room(ctx, b, Key(r.Conn))
	if reason, detail := checkRecord(r, true); reason != "" {
		s.refuse(reason, "malformed release", "from", from, "conn", r.Conn, "detail", detail)
		return reason, nil
	}
	cur, ok := s.live(ctx, r.Conn)
	if !ok {
		return "", nil // nothing to withdraw: the same answer as withdrawn
	}
	who, err := s.identity(ctx, from)
	if err != nil {
		return "identity", err
	}
	if cur.owner != who {
		s.refuse("owner", "release from another source than the record's", "from", from, "conn", r.Conn, "owner", cur.owner)
		return "owner", nil
	}
	s.stage(b, r.Conn, store.Op{Key: Key(r.Conn), Delete: true}, nil, "released")
	return "", nil
}

// blankRecord is an encodable record for a refusal of a message that
// carries none (or one the codec would not encode back).
func blankRecord() vcmp.Record {
	z := netip.AddrPortFrom(netip.IPv4Unspecified(), 0)
	return vcmp.Record{Conn: vcmp.Tuple{Proto: vcmp.TCP, Local: z, Remote: z}, Phys: z}
}

// Handle answers one message from a VCMP stream whose source is from: a
// batch of one (HandleBatch).
func (s *Service) Handle(ctx context.Context, m vcmp.Message, from netip.Addr) *vcmp.LocAnswer {
	return s.HandleBatch(ctx, []vcmp.Message{m}, from)[0].(*vcmp.LocAnswer)
}

// HandleBatch answers the messages of one VCMP batch from a source at
// from, in order. Every message gets a VCMP_LOC_ANSWER, so a batch's
// answers line up: a query is answered found, stored, not found or
// refused; a store stored or refused; a release not found (nothing stored
// now) or refused; anything else refused (this place keeps locations
// only).
//
// Each record is checked as if the batch's earlier records were stored
// (the same checks and refusals as one at a time), and the batch's writes
// go to the store together: one transaction per Config.MaxTxnOps records
// rather than one write per record. A record is answered stored (or
// released) only once its transaction committed; if it fails, the
// transaction's records are answered refused (counted store_errors) and
// the index is as it was before them.
func (s *Service) HandleBatch(ctx context.Context, ms []vcmp.Message, from netip.Addr) []vcmp.Message {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := &batch{keys: map[string]bool{}, out: make([]*vcmp.LocAnswer, len(ms))}
	for i, m := range ms {
		b.cur = i
		b.out[i] = s.handle(ctx, b, m, from)
	}
	s.flush(ctx, b)
	out := make([]vcmp.Message, len(ms))
	for i, a := range b.out {
		s.counters["answered_"+locStatusName(a.Status)]++
		out[i] = a
	}
	return out
}

// handle decides one message of b. Called with s.mu held.
func (s *Service) handle(ctx context.Context, b *batch, m vcmp.Message, from netip.Addr) *vcmp.LocAnswer {
	ans := func(r vcmp.Record, st vcmp.LocStatus) *vcmp.LocAnswer {
		return &vcmp.LocAnswer{Record: r, Status: st}
	}
	switch m := m.(type) {
	case *vcmp.LocQuery:
		if reason, detail := checkRecord(m.Record, !m.Store); reason != "" {
			s.refuse(reason, "malformed query", "from", from, "conn", m.Conn, "detail", detail)
			return ans(m.Record, vcmp.LocRefused)
		}
		if b.keys[Key(m.Conn.Reverse())] {
			// Found is an answer from the store: the record it finds
			// must be committed first.
			s.flush(ctx, b)
		}
		if e, ok := s.live(ctx, m.Conn.Reverse()); ok {
			a := ans(m.Record, vcmp.LocFound)
			a.Peer = e.phys
			return a
		}
		if !m.Store {
			return ans(m.Record, vcmp.LocNotFound)
		}
		reason, err := s.put(ctx, b, m.Record, from)
		if err != nil {
			s.rlog.Warn("store_error", "vnat location server: store", "err", err)
		}
		if reason != "" || err != nil {
			return ans(m.Record, vcmp.LocRefused)
		}
		return ans(m.Record, vcmp.LocStored)
	case *vcmp.LocStore:
		var reason string
		var err error
		st := vcmp.LocStored
		if vcmp.IsRelease(m) {
			reason, err = s.release(ctx, b, m.Record, from)
			st = vcmp.LocNotFound
		} else {
			reason, err = s.put(ctx, b, m.Record, from)
		}
		if err != nil {
			s.rlog.Warn("store_error", "vnat location server: store", "err", err)
		}
		if reason != "" || err != nil {
			return ans(m.Record, vcmp.LocRefused)
		}
		return ans(m.Record, st)
	case nil:
		s.refuse("command", "empty message", "from", from)
	default:
		s.refuse("command", "not a location message", "from", from, "command", m.Command())
	}
	return ans(blankRecord(), vcmp.LocRefused)
}

// batch is the writes of one VCMP batch not yet committed. The index
// already shows them, so the batch's later records are checked against
// them; a failed commit puts back what they replaced.
type batch struct {
	ops  []pending
	keys map[string]bool // the keys ops write: a transaction names a key once
	cur  int             // the message being decided
	out  []*vcmp.LocAnswer
}

// pending is one write of a batch.
type pending struct {
	op      store.Op
	t       vcmp.Tuple
	prev    entry // what the index held for t before, if hadPrev
	hadPrev bool
	ans     int    // the message it answers
	counter string // stored, refreshed or released, once committed
}

// room commits b's writes if the next one, to key, cannot join them: the
// key is already written (a transaction names a key once) or the
// transaction is full. It runs before the next record is checked, so that
// record is checked against what the store holds. Called with s.mu held.
func (s *Service) room(ctx context.Context, b *batch, key string) {
	if b.keys[key] || len(b.ops) >= s.cfg.MaxTxnOps {
		s.flush(ctx, b)
	}
}

// stage adds a write of t to b and shows it in the index: next is the
// record's new entry, nil for a release. Called with s.mu held.
func (s *Service) stage(b *batch, t vcmp.Tuple, op store.Op, next *entry, counter string) {
	prev, had := s.recs[t]
	if next != nil {
		s.index(t, *next)
	} else {
		s.unindex(t)
	}
	b.ops = append(b.ops, pending{op: op, t: t, prev: prev, hadPrev: had, ans: b.cur, counter: counter})
	b.keys[op.Key] = true
}

// flush commits b's writes. Each one committed is counted and given to
// Config.Index; each one that is not is undone in the index and its
// message answered refused. Called with s.mu held.
func (s *Service) flush(ctx context.Context, b *batch) {
	if len(b.ops) == 0 {
		return
	}
	ops := make([]store.Op, len(b.ops))
	for i, p := range b.ops {
		ops[i] = p.op
	}
	rev, n, err := s.commit(ctx, ops)
	for _, p := range b.ops[:n] {
		s.counters[p.counter]++
	}
	if s.cfg.Index != nil && n > 0 {
		s.cfg.Index.committed(ops[:n], rev)
	}
	if err != nil {
		for i := len(b.ops) - 1; i >= n; i-- {
			p := b.ops[i]
			if p.hadPrev {
				s.index(p.t, p.prev)
			} else {
				s.unindex(p.t)
			}
			b.out[p.ans] = &vcmp.LocAnswer{Record: b.out[p.ans].Record, Status: vcmp.LocRefused}
			s.counters["store_errors"]++
		}
		s.rlog.Warn("store_error", "vnat location server: store", "records", len(ops)-n, "err", err)
	}
	b.ops = b.ops[:0]
	clear(b.keys)
}

// commit writes ops: in one transaction if the store takes them (etcd
// does), else one at a time. It returns the revision they were written at
// (0 when unknown) and how many of ops were written, a prefix of them.
func (s *Service) commit(ctx context.Context, ops []store.Op) (int64, int, error) {
	if tx, ok := s.store.(store.Txner); ok {
		rev, err := tx.Txn(ctx, ops)
		if err != nil {
			return 0, 0, fmt.Errorf("vnat locations: store %d records: %w", len(ops), err)
		}
		return rev, len(ops), nil
	}
	for i, o := range ops {
		var err error
		if o.Delete {
			err = s.store.Delete(ctx, o.Key)
		} else {
			err = s.store.Put(ctx, o.Key, o.Value)
		}
		if err != nil {
			return 0, i, fmt.Errorf("vnat locations: store %s: %w", o.Key, err)
		}
	}
	return 0, len(ops), nil
}

func locStatusName(st vcmp.LocStatus) string {
	switch st {
	case vcmp.LocFound:
		return "found"
	case vcmp.LocStored:
		return "stored"
	case vcmp.LocNotFound:
		return "not_found"
	}
	return "refused"
}

// Held is the set of addresses live records of moved ends (L_Vir ≠ L_Phys)
// name: the virtual ones some VNAT endpoint's connections still use, which
// the controller must not hand out (paper §3.4.2), and the physical ones
// the records say the ends are at. It reads the store, so any process may
// ask.
func Held(ctx context.Context, s store.Store, now time.Time) (map[netip.Addr]bool, error) {
	kvs, _, err := s.List(ctx, Prefix)
	if err != nil {
		return nil, fmt.Errorf("vnat locations: held addresses: %w", err)
	}
	held := map[netip.Addr]bool{}
	for k, b := range kvs {
		t, e, err := parse(b)
		if err != nil || Key(t) != k {
			// Not written by a server (Load deletes it): it holds nothing,
			// and must not stop every allocation.
			continue
		}
		if now.Before(e.expires) && t.Local.Addr() != e.phys.Addr() {
			// The virtual address its end moved away from, and where it
			// is now: given to another VM, that one would be taken for
			// the end by the end's peer (a record answers it there until
			// the end refreshes from its next place).
			held[t.Local.Addr()] = true
			held[e.phys.Addr()] = true
		}
	}
	return held, nil
}

// HeldList is Held sorted, for messages.
func HeldList(held map[netip.Addr]bool) string {
	out := make([]string, 0, len(held))
	for a := range held {
		out = append(out, a.String())
	}
	sort.Strings(out)
	return strings.Join(out, ",")
}
