package testenv

import (
	"errors"
	"testing"
)

func TestWithLogsShowsTheLogsAsTheyAreWhenPrinted(t *testing.T) {
	if WithLogs(nil, &Buffer{}) != nil {
		t.Fatal("WithLogs(nil) is an error")
	}
	a, b := &Buffer{}, &Buffer{}
	refused := errors.New("refused")
	err := WithLogs(refused, a, b)
	a.Write([]byte("a: listening"))  //nolint:errcheck // a Buffer never fails
	b.Write([]byte("b: starting\n")) //nolint:errcheck // a Buffer never fails
	if got, want := err.Error(), "refused\na: listening\n---\nb: starting\n"; got != want {
		t.Fatalf("error %q, want %q", got, want)
	}
	if !errors.Is(err, refused) {
		t.Fatal("WithLogs hides its error from errors.Is")
	}
}
