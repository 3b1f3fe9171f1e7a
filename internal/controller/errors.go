package controller

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
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
	// Dependants names, "KIND NAME" each ("vm blue/web/web1", "tap mon"),
	// what a refused delete would leave dangling (409, ErrConflict): what
	// to delete first, or what a cascade deletes.
	Dependants []string `json:"dependants,omitempty"`
	kind       error    // ErrNotFound, ErrConflict, ErrFull, or nil for a bad value
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

// inUse refuses the delete of what (a farm, a subnet; named by field)
// while dependants ("KIND NAME" each) depend on it (409): the message and
// the dependants list name each, and say how a cascade would go.
func inUse(field, what string, dependants []string) error {
	return &FieldError{Field: field, kind: ErrConflict, Dependants: dependants,
		Msg: fmt.Sprintf("%s is in use by %s: delete them first, or delete it with cascade=true (CLI --cascade), which deletes them", what, strings.Join(dependants, ", "))}
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

// alloc returns a copy of every allocation: farm, subnet and VM ids. It
// costs a copy of every VM's id; allocIn copies one subnet's.
func (c *Controller) alloc(ctx context.Context) (*ipam.Allocations, error) {
	return c.allocIn(ctx)
}

// allocIn returns a copy of the farm and subnet ids and of the VM ids of
// the subnets named (FARM/SUBNET; every subnet's when none is): what
// saveAlloc with the same subnets writes back.
func (c *Controller) allocIn(ctx context.Context, subnets ...string) (*ipam.Allocations, error) {
	var a *ipam.Allocations
	err := c.view(ctx, func(m *model) error {
		a = m.allocations(subnets...)
		return nil
	})
	return a, err
}

// saveAlloc writes what changed in a: the farm and subnet ids
// (intent.AllocKey) and the VM ids of the subnets named, one key per
// subnet (intent.VMIDsPrefix); with no subnet named, a holds every VM's
// id and every subnet's key is written where it changed.
func (c *Controller) saveAlloc(ctx context.Context, a *ipam.Allocations, subnets ...string) error {
	type write struct {
		key string
		val []byte // nil: delete
	}
	var writes []write
	err := c.view(ctx, func(m *model) error {
		scope := map[string]bool{}
		for _, sub := range subnets {
			scope[sub] = true
		}
		all := len(subnets) == 0
		want := map[string]map[string]uint32{}
		for full, id := range a.VMs {
			i := strings.LastIndexByte(full, '/')
			if i < 0 {
				return fmt.Errorf("allocation of vm %q: want FARM/SUBNET/VM", full)
			}
			sub := full[:i]
			if !all && !scope[sub] {
				continue
			}
			if want[sub] == nil {
				want[sub] = map[string]uint32{}
			}
			want[sub][full[i+1:]] = id
		}
		if all || m.legacyVMs {
			for sub := range m.vmids {
				scope[sub] = true
			}
			for sub := range want {
				scope[sub] = true
			}
		}
		for _, sub := range sortedKeys(scope) {
			w, ok := want[sub]
			if !ok && !all && m.legacyVMs && !slices.Contains(subnets, sub) {
				// Out of scope, but only in intent.AllocKey so far.
				w = m.vmids[sub]
			}
			switch {
			case maps.Equal(w, m.vmids[sub]) && !m.legacyVMs:
			case len(w) == 0:
				writes = append(writes, write{key: intent.VMIDsPrefix + sub})
			default:
				writes = append(writes, write{key: intent.VMIDsPrefix + sub, val: mustJSON(w)})
			}
		}
		// Last, so that the VM ids of the layout of before leave
		// intent.AllocKey only once every subnet has its own key.
		if m.legacyVMs || !maps.Equal(a.Farms, m.allocFarms) || !maps.Equal(a.Subnets, m.allocSubnets) {
			writes = append(writes, write{key: intent.AllocKey, val: mustJSON(ipam.Allocations{Farms: a.Farms, Subnets: a.Subnets})})
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, w := range writes {
		if w.val == nil {
			err = c.store.Delete(ctx, w.key)
		} else {
			err = c.store.Put(ctx, w.key, w.val)
		}
		if err != nil {
			return err
		}
	}
	if len(writes) > 0 {
		c.model.mu.Lock()
		c.model.legacyVMs = false
		c.model.mu.Unlock()
	}
	return nil
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
