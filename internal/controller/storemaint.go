package controller

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/onehop/onehop/internal/store"
)

// Maintainable is a store whose database can be measured, compacted and
// defragmented: etcd (*store.Etcd).
type Maintainable interface {
	Health(ctx context.Context) (store.Health, error)
	Compact(ctx context.Context, rev int64) error
	Defragment(ctx context.Context) error
	DisarmNoSpace(ctx context.Context) error
}

// StoreStatus is what `onehop status` and /metrics show of the store.
type StoreStatus struct {
	store.Health
	// NoSpace says etcd has raised its NOSPACE alarm: it refuses every
	// write until the controller (or an operator) makes room and clears
	// it.
	NoSpace bool `json:"noSpace"`
	// CompactedRevision is the revision the controller last compacted to
	// (0: it leaves compaction to the embedded member's own).
	CompactedRevision int64     `json:"compactedRevision,omitempty"`
	Compactions       uint64    `json:"compactions"`
	Defrags           uint64    `json:"defrags"`
	LastDefrag        time.Time `json:"lastDefrag,omitzero"`
	// Checked is when the figures were read; Error what went wrong then.
	Checked time.Time `json:"checked"`
	Error   string    `json:"error,omitempty"`
}

// StoreMaintainer keeps the store small: it compacts an external cluster
// itself (the embedded member compacts on its own), defragments when that
// gives back a good part of the file, and reports the database's size,
// quota and alarms, logging a NOSPACE alarm as an error when it is raised
// and when it is cleared.
type StoreMaintainer struct {
	s   Maintainable
	log *slog.Logger
	// Retain is how many revisions compaction keeps; 0 leaves compaction
	// to etcd's own (the embedded member's auto-compaction).
	Retain int64
	// Defragment when the free part of the file is at least DefragFree
	// bytes and at least DefragShare of the file, at most once per
	// DefragEvery; and whenever NOSPACE is raised and anything is free.
	DefragFree  int64
	DefragShare float64
	DefragEvery time.Duration

	mu         sync.Mutex
	st         StoreStatus
	compacted  int64
	lastDefrag time.Time
	noSpace    bool
}

// NewStoreMaintainer returns a maintainer of s; retain as Retain.
func NewStoreMaintainer(s Maintainable, retain int64, log *slog.Logger) *StoreMaintainer {
	return &StoreMaintainer{s: s, log: log, Retain: retain, DefragFree: 64 << 20, DefragShare: 0.5, DefragEvery: 10 * time.Minute}
}

// Status returns the last figures read.
func (m *StoreMaintainer) Status() StoreStatus {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.st
}

// Once measures the store, compacts and defragments it where the rules
// say, clears a NOSPACE alarm once there is room again, and returns the
// figures after all that.
func (m *StoreMaintainer) Once(ctx context.Context) (StoreStatus, error) {
	st, err := m.once(ctx)
	st.Checked = time.Now().UTC()
	if err != nil {
		st.Error = err.Error()
	}
	m.mu.Lock()
	st.CompactedRevision = m.compacted
	st.Compactions, st.Defrags = m.st.Compactions, m.st.Defrags
	st.LastDefrag = m.lastDefrag
	m.st = st
	m.mu.Unlock()
	return st, err
}

func (m *StoreMaintainer) once(ctx context.Context) (StoreStatus, error) {
	h, err := m.s.Health(ctx)
	if err != nil {
		return StoreStatus{Health: h}, err
	}
	m.noteAlarm(h)
	compactedNow := false
	if m.Retain > 0 && h.Revision-m.Retain > m.compacted {
		rev := h.Revision - m.Retain
		if err := m.s.Compact(ctx, rev); err != nil && !errors.Is(err, context.Canceled) &&
			!strings.Contains(err.Error(), "required revision has been compacted") {
			return StoreStatus{Health: h}, err
		}
		m.mu.Lock()
		m.compacted = rev
		m.st.Compactions++
		m.mu.Unlock()
		compactedNow = true
		// etcd counts the freed pages at its next backend commit (every
		// 100 ms): wait for it, briefly, so the rule below sees them.
		inUse := h.DBSizeInUse
		for range 20 {
			if h, err = m.s.Health(ctx); err != nil {
				return StoreStatus{Health: h}, err
			}
			if h.DBSizeInUse < inUse {
				break
			}
			select {
			case <-ctx.Done():
				return StoreStatus{Health: h}, ctx.Err()
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	free := h.DBSize - h.DBSizeInUse
	m.mu.Lock()
	due := time.Since(m.lastDefrag) >= m.DefragEvery
	m.mu.Unlock()
	// Under NOSPACE only a defragmentation shrinks the file the quota
	// counts, so it runs whenever anything may be free: pages reported free,
	// or revisions this pass compacted away. etcd reports those pages late
	// (bbolt frees them at a later write transaction once older readers are
	// gone, and NOSPACE stops the writes), so waiting for the report can
	// leave the alarm up for good.
	noSpaceRoom := hasNoSpace(h) && (free > 0 || compactedNow)
	if (free >= m.DefragFree && float64(free) >= m.DefragShare*float64(h.DBSize) && due) || noSpaceRoom {
		start := time.Now()
		if err := m.s.Defragment(ctx); err != nil {
			return StoreStatus{Health: h}, err
		}
		before := h.DBSize
		if h, err = m.s.Health(ctx); err != nil {
			return StoreStatus{Health: h}, err
		}
		m.mu.Lock()
		m.lastDefrag = time.Now().UTC()
		m.st.Defrags++
		m.mu.Unlock()
		m.log.Info("etcd defragmented", "size_before", before, "size", h.DBSize, "in_use", h.DBSizeInUse, "took", time.Since(start).Round(time.Millisecond))
	}
	// etcd never clears NOSPACE itself: once the file is back well under
	// the quota, writes may resume.
	if hasNoSpace(h) && h.Quota > 0 && float64(h.DBSize) < 0.9*float64(h.Quota) {
		if err := m.s.DisarmNoSpace(ctx); err != nil {
			return StoreStatus{Health: h, NoSpace: true}, err
		}
		if h, err = m.s.Health(ctx); err != nil {
			return StoreStatus{Health: h}, err
		}
		m.noteAlarm(h)
	}
	return StoreStatus{Health: h, NoSpace: hasNoSpace(h)}, nil
}

// noteAlarm logs NOSPACE when it is raised and when it is cleared: a
// store refusing writes is an outage, never silent.
func (m *StoreMaintainer) noteAlarm(h store.Health) {
	now := hasNoSpace(h)
	m.mu.Lock()
	was := m.noSpace
	m.noSpace = now
	m.mu.Unlock()
	switch {
	case now && !was:
		m.log.Error("etcd raised NOSPACE: it refuses every write until room is made (compaction, defragmentation) and the alarm is cleared",
			"size", h.DBSize, "in_use", h.DBSizeInUse, "quota", h.Quota, "alarms", h.Alarms)
	case was && !now:
		m.log.Warn("etcd NOSPACE alarm cleared: writes resume", "size", h.DBSize, "quota", h.Quota)
	}
}

func hasNoSpace(h store.Health) bool {
	for _, a := range h.Alarms {
		if strings.HasPrefix(a, "NOSPACE") {
			return true
		}
	}
	return false
}

// Run maintains the store every interval until ctx ends.
func (m *StoreMaintainer) Run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		if _, err := m.Once(ctx); err != nil && ctx.Err() == nil {
			m.log.Warn("store maintenance", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

var (
	descDBSize = prometheus.NewDesc("onehop_etcd_db_size_bytes",
		"Size of etcd's database file (what the quota is checked against).", nil, nil)
	descDBInUse = prometheus.NewDesc("onehop_etcd_db_size_in_use_bytes",
		"Part of etcd's database file holding data; the rest is free pages a defragmentation gives back.", nil, nil)
	descQuota = prometheus.NewDesc("onehop_etcd_quota_bytes",
		"Database size beyond which etcd raises NOSPACE and refuses every write.", nil, nil)
	descRevision = prometheus.NewDesc("onehop_etcd_revision",
		"etcd's current revision.", nil, nil)
	descCompacted = prometheus.NewDesc("onehop_etcd_compacted_revision",
		"Revision the controller last compacted to (0: the embedded member compacts on its own).", nil, nil)
	descAlarm = prometheus.NewDesc("onehop_etcd_alarm",
		"1 while etcd has the alarm raised (NOSPACE: every write is refused).", []string{"alarm"}, nil)
	descDefrags = prometheus.NewDesc("onehop_etcd_defrags_total",
		"Defragmentations the controller ran.", nil, nil)
	descCompactions = prometheus.NewDesc("onehop_etcd_compactions_total",
		"Compactions the controller ran.", nil, nil)
	descUp = prometheus.NewDesc("onehop_etcd_status_ok",
		"1 when the last look at etcd's status succeeded.", nil, nil)
)

// Describe implements prometheus.Collector.
func (m *StoreMaintainer) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descDBSize, descDBInUse, descQuota, descRevision, descCompacted, descAlarm, descDefrags, descCompactions, descUp} {
		ch <- d
	}
}

// Collect implements prometheus.Collector: the figures of the last look.
func (m *StoreMaintainer) Collect(ch chan<- prometheus.Metric) {
	st := m.Status()
	g := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	ok := 0.0
	if st.Error == "" && !st.Checked.IsZero() {
		ok = 1
	}
	g(descUp, ok)
	g(descDBSize, float64(st.DBSize))
	g(descDBInUse, float64(st.DBSizeInUse))
	g(descQuota, float64(st.Quota))
	g(descRevision, float64(st.Revision))
	g(descCompacted, float64(st.CompactedRevision))
	noSpace := 0.0
	if st.NoSpace {
		noSpace = 1
	}
	g(descAlarm, noSpace, "NOSPACE")
	ch <- prometheus.MustNewConstMetric(descDefrags, prometheus.CounterValue, float64(st.Defrags))
	ch <- prometheus.MustNewConstMetric(descCompactions, prometheus.CounterValue, float64(st.Compactions))
}

// SetStoreMaintainer makes m the store's maintainer: its figures go to
// GET /v1/store and /metrics. Call it before serving the API.
func (c *Controller) SetStoreMaintainer(m *StoreMaintainer) { c.maint = m }
