package controller

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/ipam"
	"github.com/onehop/onehop/internal/policy"
	"github.com/onehop/onehop/internal/store"
)

// Errors the API maps to HTTP statuses (a *FieldError wraps one of them, or
// none for a bad value: 400).
var (
	ErrNotFound = errors.New("not found")      // 404
	ErrConflict = errors.New("already exists") // 409
	// ErrFull is a capacity with no room left: an id range (the 255 farms, a
	// farm's subnets, a subnet's VMs) or a host's datapath. 409.
	ErrFull = errors.New("no room left")
)

// FieldError says which input is wrong and why: Field is a JSON body field
// ("name", "rule.portLo", "body" for the body as a whole) or a path
// parameter ("farm", "vm"). Every error the API answers names one.
type FieldError struct {
	Field string `json:"field"`
	Msg   string `json:"error"`
	kind  error  // ErrNotFound, ErrConflict, ErrFull, or nil for a bad value
}

func (e *FieldError) Error() string { return fmt.Sprintf("%s: %s", e.Field, e.Msg) }

// Unwrap lets errors.Is find the kind (ErrNotFound, ...).
func (e *FieldError) Unwrap() error { return e.kind }

// fieldErr says field holds a bad value (400).
func fieldErr(field string, err error) error {
	var fe *FieldError
	if errors.As(err, &fe) {
		return &FieldError{Field: field, Msg: fe.Msg}
	}
	return &FieldError{Field: field, Msg: err.Error()}
}

// policyErr names a field a policy check rejected, under prefix ("rule.").
func policyErr(prefix string, err error) error {
	var pe *policy.FieldError
	if errors.As(err, &pe) {
		return &FieldError{Field: prefix + pe.Field, Msg: pe.Msg}
	}
	return &FieldError{Field: strings.TrimSuffix(prefix, "."), Msg: err.Error()}
}

func notFound(field, format string, a ...any) error {
	return &FieldError{Field: field, Msg: fmt.Sprintf(format, a...) + ": not found", kind: ErrNotFound}
}

func conflict(field, format string, a ...any) error {
	return &FieldError{Field: field, Msg: fmt.Sprintf(format, a...) + ": already exists", kind: ErrConflict}
}

// full says the capacity field refers to has no room left (409).
func full(field string, err error) error {
	return &FieldError{Field: field, Msg: err.Error(), kind: ErrFull}
}

// allocErr turns an ipam error into the API's: an id range that ran out is
// ErrFull (409), anything else a bad value of field.
func allocErr(field string, err error) error {
	if errors.Is(err, ipam.ErrExhausted) {
		return full(field, err)
	}
	return fieldErr(field, err)
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
