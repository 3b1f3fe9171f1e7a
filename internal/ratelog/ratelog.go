// Package ratelog bounds the log lines that untrusted parties can cause. A
// VM that floods DHCP or sends garbage must not fill the host's disk or
// drown the lines about other tenants: each key (an event and who caused it)
// gets at most a burst of lines per window; the rest are counted and the
// count rides on the key's next line that is written.
package ratelog

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// MaxKeys bounds the limiter's memory: a party that invents keys (a VM
// cycling source addresses) shares one overflow budget past it.
const MaxKeys = 4096

// overflowKey is the budget every key beyond MaxKeys shares.
const overflowKey = "\x00overflow"

// Logger writes through log at most Burst lines per Window and key.
type Logger struct {
	log    *slog.Logger
	burst  int
	window time.Duration
	now    func() time.Time

	mu   sync.Mutex
	keys map[string]*bucket
}

type bucket struct {
	start      time.Time
	written    int
	suppressed int
}

// New returns a limiter of burst lines per window and key. now is the clock
// (time.Now outside tests).
func New(log *slog.Logger, burst int, window time.Duration, now func() time.Time) *Logger {
	if burst < 1 {
		burst = 1
	}
	if now == nil {
		now = time.Now
	}
	return &Logger{log: log, burst: burst, window: window, now: now, keys: map[string]*bucket{}}
}

// Allow reports whether a line under key may be written now and how many
// lines of that key were suppressed since the last one written.
func (l *Logger) Allow(key string) (ok bool, suppressed int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	b := l.keys[key]
	if b == nil {
		l.forgetIdle(now)
		if len(l.keys) >= MaxKeys {
			key = overflowKey
			b = l.keys[key]
		}
		if b == nil {
			b = &bucket{start: now}
			l.keys[key] = b
		}
	}
	if now.Sub(b.start) >= l.window {
		b.start, b.written = now, 0
	}
	if b.written >= l.burst {
		b.suppressed++
		return false, 0
	}
	b.written++
	suppressed, b.suppressed = b.suppressed, 0
	return true, suppressed
}

// forgetIdle drops keys whose window ended with nothing left to report, so
// the map holds only parties active lately.
func (l *Logger) forgetIdle(now time.Time) {
	if len(l.keys) < MaxKeys/2 {
		return
	}
	for k, b := range l.keys {
		if b.suppressed == 0 && now.Sub(b.start) >= l.window {
			delete(l.keys, k)
		}
	}
}

// Log writes msg at level under key if its budget allows; a line written
// after some were suppressed says how many ("suppressed").
func (l *Logger) Log(level slog.Level, key, msg string, args ...any) {
	ok, suppressed := l.Allow(key)
	if !ok {
		return
	}
	if suppressed > 0 {
		args = append(args, "suppressed", suppressed)
	}
	l.log.Log(context.Background(), level, msg, args...)
}

// Warn is Log at warning level.
func (l *Logger) Warn(key, msg string, args ...any) { l.Log(slog.LevelWarn, key, msg, args...) }

// Info is Log at info level.
func (l *Logger) Info(key, msg string, args ...any) { l.Log(slog.LevelInfo, key, msg, args...) }
