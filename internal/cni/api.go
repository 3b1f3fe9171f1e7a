package cni

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/onehop/onehop/internal/addrplan"
	"github.com/onehop/onehop/internal/client"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/pki"
)

// Doer is the controller's REST API (*client.Client).
type Doer interface {
	Do(method, path string, in, out any) error
}

// NewAPI is the Controller of config c: its api, with its ca and its
// tokenFile or cert and key read now (an unreadable file is named). The
// cloud's address plan is read through it too (usePlan): a container's
// address has its subnet's length.
func NewAPI(c NetConf) (Controller, error) {
	if !strings.HasPrefix(c.API, "https://") {
		a := API{client.New(c.API)}
		return a, usePlan(a)
	}
	files := pki.Files{CA: c.CA, Cert: c.Cert, Key: c.Key}
	tc, err := files.ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("network config: ca/cert/key: %w", err)
	}
	var token string
	if c.TokenFile != "" {
		if token, err = pki.ReadToken(c.TokenFile); err != nil {
			return nil, fmt.Errorf("network config: tokenFile: %w", err)
		}
	}
	a := API{client.NewWith(c.API, client.Options{TLS: tc, Token: token})}
	return a, usePlan(a)
}

// usePlan makes the controller's address plan this process's. A
// controller older than plans (404) is one of the default plan.
func usePlan(a API) error {
	var info struct {
		Plan string `json:"plan"`
	}
	err := a.D.Do("GET", "/v1/plan", nil, &info)
	if ae := apiError(err); ae != nil && ae.Status == 404 {
		return nil
	}
	if err != nil {
		return controllerError("read the address plan", err)
	}
	p, err := addrplan.Parse(info.Plan)
	if err != nil {
		return controllerError("the controller's address plan", err)
	}
	return addrplan.Set(p)
}

// API is Controller over the REST API.
type API struct{ D Doer }

func vmPath(farm, subnet, name string) string {
	return "/v1/farms/" + farm + "/subnets/" + subnet + "/vms/" + name
}

// CreateVM implements Controller.
func (a API) CreateVM(_ context.Context, farm, subnet, name, host, iface string, container intent.VMContainer) (intent.VM, error) {
	var v intent.VM
	body := map[string]any{"name": name, "host": host, "interface": iface, "container": container}
	err := a.D.Do("POST", "/v1/farms/"+farm+"/subnets/"+subnet+"/vms", body, &v)
	return v, err
}

// VMs implements Controller: the farm's VMs.
func (a API) VMs(_ context.Context, farm string) ([]intent.VM, error) {
	var vms []intent.VM
	err := a.D.Do("GET", "/v1/farms/"+farm+"/vms", nil, &vms)
	return vms, err
}

// DeleteVM implements Controller.
func (a API) DeleteVM(_ context.Context, farm, subnet, name string) error {
	err := a.D.Do("DELETE", vmPath(farm, subnet, name), nil, nil)
	if ae := apiError(err); ae != nil && ae.Status == 404 {
		return fmt.Errorf("%w: %v", ErrNoVM, err)
	}
	return err
}

// VM implements Controller: the one VM's GET.
func (a API) VM(_ context.Context, farm, subnet, name string) (intent.VM, error) {
	var v intent.VM
	err := a.D.Do("GET", vmPath(farm, subnet, name), nil, &v)
	if ae := apiError(err); ae != nil && ae.Status == 404 {
		return v, fmt.Errorf("%w: %v", ErrNoVM, err)
	}
	return v, err
}

// Where implements Controller: the farm's, the subnet's and the host's
// GET, each answering 404 when the controller has no such object.
func (a API) Where(_ context.Context, farm, subnet, host string) (string, error) {
	for _, q := range []struct {
		path, missing string
	}{
		{"/v1/farms/" + farm, fmt.Sprintf("farm %q: the controller has no such farm", farm)},
		{"/v1/farms/" + farm + "/subnets/" + subnet, fmt.Sprintf("subnet %q: farm %s has no such subnet", subnet, farm)},
		{"/v1/hosts/" + host, fmt.Sprintf("host %q: the controller has no such host (onehop host add %s)", host, host)},
	} {
		err := a.D.Do("GET", q.path, nil, nil)
		switch ae := apiError(err); {
		case ae != nil && ae.Status == 404:
			return q.missing, nil
		case ae != nil && ae.Status == 400:
			return ae.Error(), nil // a malformed name, named by the controller
		case err != nil:
			return "", err
		}
	}
	return "", nil
}

// apiError is err's API error, if it is one.
func apiError(err error) *client.APIError {
	var ae *client.APIError
	if errors.As(err, &ae) {
		return ae
	}
	return nil
}

// controllerError is a failed API call as a CNI error: an unreachable
// controller is worth another try, a refusal is the controller's message.
func controllerError(what string, err error) error {
	ae := apiError(err)
	switch {
	case ae == nil:
		return &Error{Code: ErrTryAgainLater, Msg: what + ": " + err.Error()}
	case ae.Status == 401 || ae.Status == 403:
		return &Error{Code: ErrInvalidConfig, Msg: what + ": the controller refused the credentials (network config: tokenFile, or cert and key)", Details: ae.Error()}
	case ae.Status >= 500:
		return &Error{Code: ErrTryAgainLater, Msg: what + ": " + ae.Error()}
	}
	return &Error{Code: ErrControllerRefused, Msg: what + ": " + ae.Error()}
}
