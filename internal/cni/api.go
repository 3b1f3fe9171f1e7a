package cni

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/onehop/onehop/internal/client"
	"github.com/onehop/onehop/internal/intent"
	"github.com/onehop/onehop/internal/pki"
)

// Doer is the controller's REST API (*client.Client).
type Doer interface {
	Do(method, path string, in, out any) error
}

// NewAPI is the Controller of config c: its api, with its ca and its
// tokenFile or cert and key read now (an unreadable file is named).
func NewAPI(c NetConf) (Controller, error) {
	if !strings.HasPrefix(c.API, "https://") {
		return API{client.New(c.API)}, nil
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
	return API{client.NewWith(c.API, client.Options{TLS: tc, Token: token})}, nil
}

// API is Controller over the REST API.
type API struct{ D Doer }

func vmPath(farm, subnet, name string) string {
	return "/v1/farms/" + farm + "/subnets/" + subnet + "/vms/" + name
}

// CreateVM implements Controller.
func (a API) CreateVM(_ context.Context, farm, subnet, name, host, iface string) (intent.VM, error) {
	var v intent.VM
	err := a.D.Do("POST", "/v1/farms/"+farm+"/subnets/"+subnet+"/vms", map[string]string{"name": name, "host": host, "interface": iface}, &v)
	return v, err
}

// DeleteVM implements Controller.
func (a API) DeleteVM(_ context.Context, farm, subnet, name string) error {
	err := a.D.Do("DELETE", vmPath(farm, subnet, name), nil, nil)
	if ae := apiError(err); ae != nil && ae.Status == 404 {
		return fmt.Errorf("%w: %v", ErrNoVM, err)
	}
	return err
}

// VM implements Controller (from the list of VMs: the API has no GET of
// one).
func (a API) VM(_ context.Context, farm, subnet, name string) (intent.VM, error) {
	var vms []intent.VM
	if err := a.D.Do("GET", "/v1/vms", nil, &vms); err != nil {
		return intent.VM{}, err
	}
	for _, v := range vms {
		if v.Farm == farm && v.Subnet == subnet && v.Name == name {
			return v, nil
		}
	}
	return intent.VM{}, fmt.Errorf("%w: %s/%s/%s", ErrNoVM, farm, subnet, name)
}

// Where implements Controller.
func (a API) Where(_ context.Context, farm, subnet, host string) (string, error) {
	var farms []intent.Farm
	if err := a.D.Do("GET", "/v1/farms", nil, &farms); err != nil {
		return "", err
	}
	if !hasName(farms, farm, func(f intent.Farm) string { return f.Name }) {
		return fmt.Sprintf("farm %q: the controller has no such farm", farm), nil
	}
	var subnets []intent.Subnet
	if err := a.D.Do("GET", "/v1/subnets", nil, &subnets); err != nil {
		return "", err
	}
	if !hasName(subnets, farm+"/"+subnet, func(s intent.Subnet) string { return s.Farm + "/" + s.Name }) {
		return fmt.Sprintf("subnet %q: farm %s has no such subnet", subnet, farm), nil
	}
	var hosts []intent.Host
	if err := a.D.Do("GET", "/v1/hosts", nil, &hosts); err != nil {
		return "", err
	}
	if !hasName(hosts, host, func(h intent.Host) string { return h.Name }) {
		return fmt.Sprintf("host %q: the controller has no such host (onehop host add %s)", host, host), nil
	}
	return "", nil
}

func hasName[T any](list []T, want string, name func(T) string) bool {
	for _, x := range list {
		if name(x) == want {
			return true
		}
	}
	return false
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
