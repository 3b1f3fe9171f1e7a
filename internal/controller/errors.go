package controller

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/ipam"
	"github.com/onehop/onehop/internal/store"
)

// Errors the API maps to HTTP statuses.
var (
	ErrNotFound = errors.New("not found")
	ErrConflict = errors.New("already exists")
)

// FieldError says which input field is wrong and why.
type FieldError struct {
	Field string `json:"field"`
	Msg   string `json:"error"`
}

func (e *FieldError) Error() string { return fmt.Sprintf("%s: %s", e.Field, e.Msg) }

func fieldErr(field string, err error) error { return &FieldError{Field: field, Msg: err.Error()} }

func notFound(format string, a ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, a...), ErrNotFound)
}

func conflict(format string, a ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, a...), ErrConflict)
}

func (c *Controller) alloc(ctx context.Context) (*ipam.Allocations, error) {
	var a ipam.Allocations
	if err := store.GetJSON(ctx, c.store, intent.AllocKey, &a); err != nil && !errors.Is(err, store.ErrNotFound) {
		return nil, err
	}
	return &a, nil
}

// qualify turns "web" into "farm/web" and checks the subnet exists.
func (c *Controller) qualify(ctx context.Context, farm, field, ref string) (string, error) {
	if !strings.Contains(ref, "/") {
		ref = farm + "/" + ref
	}
	if _, err := c.store.Get(ctx, intent.SubnetsPrefix+ref); errors.Is(err, store.ErrNotFound) {
		return "", fieldErr(field, fmt.Errorf("no subnet %q", ref))
	}
	return ref, nil
}
