package vnatd

import (
	"errors"
	"time"

	"github.com/onehop/onehop/internal/vcmp"
)

// logLimit lets one line of a kind through per second and says how many it
// held back: every refusal a remote host can provoke is logged this way.
type logLimit struct {
	last       time.Time
	suppressed int
}

// warn logs a refusal of kind, rate-limited per kind. Called with e.mu held.
func (e *Engine) warn(kind, msg string, args ...any) {
	e.counters[kind]++
	l := e.limit[kind]
	if l == nil {
		l = &logLimit{}
		e.limit[kind] = l
	}
	now := e.cfg.Now()
	if now.Sub(l.last) < time.Second {
		l.suppressed++
		return
	}
	if l.suppressed > 0 {
		args = append(args, "suppressed", l.suppressed)
	}
	l.last, l.suppressed = now, 0
	e.log.Warn(msg, args...)
}

// refusal names Open's error kinds for the counters.
func refusal(err error) string {
	switch {
	case errors.Is(err, vcmp.ErrForged):
		return "refused_forged"
	case errors.Is(err, vcmp.ErrReplayed):
		return "refused_replayed"
	case errors.Is(err, vcmp.ErrUnkeyed):
		return "refused_unkeyed"
	case errors.Is(err, vcmp.ErrNoKey):
		return "refused_nokey"
	}
	return "refused_other"
}
