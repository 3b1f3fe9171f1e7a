package testenv

import (
	"bytes"
	"strings"
	"sync"
)

// Buffer collects what a daemon or a server's log writes while the test
// reads it: a bytes.Buffer safe for use by both at once.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String is everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// WithLogs is err (nil if err is nil) followed by the logs, read only when
// the error is printed: a check that Eventually runs fails many times
// before one of its errors is shown.
func WithLogs(err error, logs ...*Buffer) error {
	if err == nil {
		return nil
	}
	return withLogs{err, logs}
}

type withLogs struct {
	err  error
	logs []*Buffer
}

func (e withLogs) Error() string {
	var b strings.Builder
	b.WriteString(e.err.Error())
	for i, l := range e.logs {
		if i > 0 {
			b.WriteString("\n---")
		}
		b.WriteString("\n" + l.String())
	}
	return b.String()
}

func (e withLogs) Unwrap() error { return e.err }
