package controller

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/store"
	"github.com/onehop/onehop/internal/version"
)

// downStore is a store whose every read fails, as an etcd that went away.
type downStore struct{ store.Store }

func (downStore) Get(context.Context, string) ([]byte, error) {
	return nil, errors.New("context deadline exceeded")
}

func TestControllerIsReadyOnlyWhileItsStoreAnswers(t *testing.T) {
	up := New(store.NewMemory(), slog.New(slog.DiscardHandler))
	if err := up.StoreReachable(t.Context()); err != nil {
		t.Fatalf("a store that answers (the key is absent): %v", err)
	}
	down := New(downStore{store.NewMemory()}, slog.New(slog.DiscardHandler))
	if err := down.StoreReachable(t.Context()); err == nil || !strings.Contains(err.Error(), "store unreachable: context deadline exceeded") {
		t.Fatalf("a store that does not answer: %v, want store unreachable and why", err)
	}
}

func TestTheAPIServesTheControllersVersion(t *testing.T) {
	srv, _ := apiServer(t)
	code, got := call(t, srv, "GET", "/v1/version", "")
	v := version.Get()
	if code != 200 || got["version"] != v.Version || got["bpf"] != v.BPF || got["go"] != v.Go {
		t.Fatalf("GET /v1/version: %d %v, want %+v", code, got, v)
	}
}
