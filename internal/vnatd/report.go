package vnatd

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"time"
)

// RestoreReport is what the last restore after an address change did and
// how long it took, as `onehop vnat status` shows it: the paper's Table 1
// (§6.4) measures exactly this, and a log line is too coarse to read it
// back from.
type RestoreReport struct {
	Old string `json:"old"` // the address the connections left
	New string `json:"new"` // the address they travel from now
	// Seen: the daemon saw the new address (netlink); Done: the restore
	// returned (every connection migrated, aborted or waiting for its
	// peer; the peers' translations are in before their answers).
	Seen time.Time `json:"seen"`
	Done time.Time `json:"done"`
	// TookUS is Done-Seen in microseconds.
	TookUS int64 `json:"took_us"`
	// Conns are the connections at the new address after the restore, by
	// state; Migrated and Aborted are the counters' growth during it.
	Conns    int            `json:"conns"`
	States   map[string]int `json:"states"`
	Migrated uint64         `json:"migrated"`
	Aborted  uint64         `json:"aborted"`
	Err      string         `json:"error,omitempty"`
}

// String is the report on one line, as the CLI prints it.
func (r *RestoreReport) String() string {
	var st []string
	for _, s := range []string{"migrated", "suspended", "locating", "aborted", "active"} {
		if n := r.States[s]; n > 0 {
			st = append(st, fmt.Sprintf("%d %s", n, s))
		}
	}
	s := fmt.Sprintf("last restore: %s -> %s at %s: %d connection(s) (%s) in %.3f ms",
		r.Old, r.New, r.Seen.Format(time.RFC3339Nano), r.Conns, strings.Join(st, ", "), float64(r.TookUS)/1e3)
	if r.Err != "" {
		s += "; error: " + r.Err
	}
	return s
}

// lastRestore keeps the latest RestoreReport (its own lock: reading it
// must not wait for a restore in progress, which holds the engine's).
type lastRestore struct {
	mu sync.Mutex
	r  *RestoreReport
}

// LastRestore is the report of the latest restore, nil before the first.
func (e *Engine) LastRestore() *RestoreReport {
	e.report.mu.Lock()
	defer e.report.mu.Unlock()
	if e.report.r == nil {
		return nil
	}
	r := *e.report.r
	return &r
}

// RestoreAndReport is Restore, timed from seen (when the address change
// was noticed) and kept as the LastRestore report.
func (e *Engine) RestoreAndReport(ctx context.Context, old, new netip.Addr, seen time.Time) (*RestoreReport, error) {
	before := e.Counters()
	err := e.Restore(ctx, old, new)
	done := time.Now()
	after := e.Counters()
	r := &RestoreReport{Old: old.String(), New: new.String(), Seen: seen, Done: done,
		TookUS: done.Sub(seen).Microseconds(), States: map[string]int{},
		Migrated: after["migrated"] - before["migrated"], Aborted: after["aborted"] - before["aborted"]}
	if err != nil {
		r.Err = err.Error()
	}
	prefix := new.String() + ":"
	for _, c := range e.Status() {
		if strings.HasPrefix(c.Physical, prefix) {
			r.Conns++
			r.States[c.State]++
		}
	}
	e.report.mu.Lock()
	e.report.r = r
	e.report.mu.Unlock()
	return r, err
}
