// Package testenv says what a test needs from the machine. Outside CI a
// missing privilege, tool or kernel feature skips the test with the reason;
// under CI=true it fails it, so a CI run can never go green by skipping.
// It also holds what every test that waits on something asynchronous uses:
// Eventually, and a Buffer for the logs it shows when the wait fails.
package testenv

import (
	"os"
	"os/exec"
	"testing"
)

// InCI reports whether the tests run under CI (CI=true), where nothing may skip.
func InCI() bool { return os.Getenv("CI") == "true" }

// Missing skips t, or fails it under CI, saying what is missing and why.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	if InCI() {
		t.Fatalf("CI=true: "+format, args...)
	}
	t.Skipf(format, args...)
}

// RequireRoot stops t unless it runs as root (BPF, namespaces).
func RequireRoot(t testing.TB, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		Missing(t, "needs root: %s", why)
	}
}

// RequireTool stops t unless every named command is on PATH.
func RequireTool(t testing.TB, names ...string) {
	t.Helper()
	for _, n := range names {
		if _, err := exec.LookPath(n); err != nil {
			Missing(t, "needs %s on PATH (make deps installs it)", n)
		}
	}
}
