package cni

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/onehop/onehop/internal/topology"
)

// SupportedVersions are the spec versions the plugin speaks: their results
// differ only in the "version" of each IP (before 1.0.0).
var SupportedVersions = []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"}

// Version is the newest spec version the plugin speaks.
const Version = "1.1.0"

// DefaultAttachTimeout is how long ADD waits for the host's agent to
// attach to the container's veth when the config does not say.
const DefaultAttachTimeout = 10 * time.Second

// MaxAttachTimeout bounds attachTimeout: a runtime that waits longer for
// one container is waiting on an agent that is not there.
const MaxAttachTimeout = 5 * time.Minute

// NetConf is the network configuration the runtime gives on stdin.
type NetConf struct {
	CNIVersion string `json:"cniVersion"`
	Name       string `json:"name"`
	Type       string `json:"type"`
	// Farm and Subnet name the subnet the containers of this network join.
	Farm   string `json:"farm"`
	Subnet string `json:"subnet"`
	// API is the controller's REST API: https://HOST:PORT, http://HOST:PORT
	// (a controller run with --insecure) or a unix socket's path.
	API string `json:"api"`
	// CA verifies an https API; TokenFile holds its bearer token, or
	// Cert and Key are a client certificate signed by its CA.
	CA        string `json:"ca,omitempty"`
	TokenFile string `json:"tokenFile,omitempty"`
	Cert      string `json:"cert,omitempty"`
	Key       string `json:"key,omitempty"`
	// Host is this host's name, the --node its agent runs as (default:
	// the machine's hostname up to its first dot).
	Host string `json:"host,omitempty"`
	// AttachTimeout is how long ADD waits for the agent to attach
	// ("10s" if unset).
	AttachTimeout string `json:"attachTimeout,omitempty"`
	// DNS is handed to the runtime in ADD's result.
	DNS *DNS `json:"dns,omitempty"`
	// PrevResult is the result of the plugins before this one in a chain
	// (ADD), or of the ADD being checked (CHECK).
	PrevResult json.RawMessage `json:"prevResult,omitempty"`

	// ValidAttachments are GC's: the attachments of this network the
	// runtime still has. libcni also writes them as cni.dev/attachments (a
	// name the spec once used), read too.
	ValidAttachments []Attachment `json:"cni.dev/valid-attachments,omitempty"`
	OldAttachments   []Attachment `json:"cni.dev/attachments,omitempty"`

	// Attach is AttachTimeout parsed.
	Attach time.Duration `json:"-"`
}

// Attachment is one of GC's valid attachments.
type Attachment struct {
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifname"`
}

// knownFields are the fields a config may have: onehop's, the spec's, and
// those a runtime adds (libcni adds runtimeConfig, prevResult and, for GC,
// the valid attachments). Anything else is refused by name: a typo must
// not quietly mean the default.
var knownFields = map[string]bool{
	"cniVersion": true, "name": true, "type": true, "farm": true, "subnet": true,
	"api": true, "ca": true, "tokenFile": true, "cert": true, "key": true, "host": true,
	"attachTimeout": true, "dns": true, "prevResult": true,
	"capabilities": true, "runtimeConfig": true, "args": true, "ipMasq": true, "ipam": true,
	"cni.dev/valid-attachments": true, "cni.dev/attachments": true,
	"disableCheck": true, "disableGC": true,
}

// stringFields are the fields that hold a string: one of another type is
// named in the error rather than left to encoding/json's wording.
var stringFields = map[string]bool{
	"cniVersion": true, "name": true, "type": true, "farm": true, "subnet": true,
	"api": true, "ca": true, "tokenFile": true, "cert": true, "key": true, "host": true, "attachTimeout": true,
}

// ParseConf reads and checks a network configuration. hostname gives the
// default of "host". A field that is wrong is named in the error.
func ParseConf(b []byte, hostname func() (string, error)) (NetConf, error) {
	var c NetConf
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(b, &fields); err != nil {
		return c, &Error{Code: ErrDecodingFailure, Msg: "network config on stdin is not a JSON object", Details: err.Error()}
	}
	var unknown []string
	for k := range fields {
		if !knownFields[k] {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return c, errorf(ErrUnsupportedField, "network config: unknown field %q (onehop's are farm, subnet, api, ca, tokenFile, cert, key, host, attachTimeout, dns)", unknown[0])
	}
	for k, raw := range fields {
		if !stringFields[k] {
			continue
		}
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return c, errorf(ErrDecodingFailure, "network config: %q must be a string, not %s", k, bytes.TrimSpace(raw))
		}
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, &Error{Code: ErrDecodingFailure, Msg: "network config: a field has the wrong type", Details: err.Error()}
	}
	if c.CNIVersion == "" {
		return c, errorf(ErrInvalidConfig, "network config: cniVersion is missing (this plugin speaks %s)", strings.Join(SupportedVersions, ", "))
	}
	if !slices.Contains(SupportedVersions, c.CNIVersion) {
		return c, errorf(ErrIncompatibleVersion, "network config: cniVersion %q is not one this plugin speaks (%s)", c.CNIVersion, strings.Join(SupportedVersions, ", "))
	}
	if c.Name == "" {
		return c, errorf(ErrInvalidConfig, "network config: name is missing")
	}
	if c.Farm == "" {
		return c, errorf(ErrInvalidConfig, "network config: farm is missing: the farm the containers join")
	}
	if err := topology.CheckFarmName(c.Farm); err != nil {
		return c, errorf(ErrInvalidConfig, "network config: farm: %v", err)
	}
	if c.Subnet == "" {
		return c, errorf(ErrInvalidConfig, "network config: subnet is missing: the subnet of farm %s the containers join", c.Farm)
	}
	if err := topology.CheckSubnetName(c.Subnet); err != nil {
		return c, errorf(ErrInvalidConfig, "network config: subnet: %v", err)
	}
	if err := checkAPI(&c); err != nil {
		return c, err
	}
	if c.Host == "" {
		h, err := hostname()
		if err != nil {
			return c, errorf(ErrInvalidConfig, "network config: host is missing and the hostname cannot be read: %v", err)
		}
		c.Host, _, _ = strings.Cut(strings.ToLower(h), ".")
		if err := topology.CheckHostName(c.Host); err != nil {
			return c, errorf(ErrInvalidConfig, "network config: host is missing and the hostname is no host name: %v; set host to the --node the agent runs as", err)
		}
	} else if err := topology.CheckHostName(c.Host); err != nil {
		return c, errorf(ErrInvalidConfig, "network config: host: %v", err)
	}
	c.Attach = DefaultAttachTimeout
	if c.AttachTimeout != "" {
		d, err := time.ParseDuration(c.AttachTimeout)
		if err != nil || d <= 0 || d > MaxAttachTimeout {
			return c, errorf(ErrInvalidConfig, "network config: attachTimeout %q: want a duration above 0 and at most %s, such as \"10s\"", c.AttachTimeout, MaxAttachTimeout)
		}
		c.Attach = d
	}
	if c.DNS != nil {
		for i, ns := range c.DNS.Nameservers {
			if _, err := netip.ParseAddr(ns); err != nil {
				return c, errorf(ErrInvalidConfig, "network config: dns.nameservers[%d] %q is not an IP address", i, ns)
			}
		}
	}
	return c, nil
}

// checkAPI checks how the controller is reached: an https API needs a way
// to authenticate (the controller takes no anonymous client over TCP).
func checkAPI(c *NetConf) error {
	switch {
	case c.API == "":
		return errorf(ErrInvalidConfig, "network config: api is missing: the controller's REST API (https://HOST:PORT or a unix socket's path)")
	case strings.HasPrefix(c.API, "https://"):
		if c.TokenFile == "" && c.Cert == "" {
			return errorf(ErrInvalidConfig, "network config: api %s is https: give tokenFile (the API's bearer token) or cert and key", c.API)
		}
	case strings.HasPrefix(c.API, "http://"):
	case filepath.IsAbs(strings.TrimPrefix(c.API, "unix://")):
	default:
		return errorf(ErrInvalidConfig, "network config: api %q: want https://HOST:PORT, http://HOST:PORT or a unix socket's absolute path", c.API)
	}
	if (c.Cert == "") != (c.Key == "") {
		return errorf(ErrInvalidConfig, "network config: cert and key go together")
	}
	for _, f := range []struct{ name, path string }{{"ca", c.CA}, {"tokenFile", c.TokenFile}, {"cert", c.Cert}, {"key", c.Key}} {
		if f.path != "" && !filepath.IsAbs(f.path) {
			return errorf(ErrInvalidConfig, "network config: %s %q: want an absolute path (the runtime's working directory is not yours)", f.name, f.path)
		}
	}
	return nil
}

// atLeast reports whether version v is at least w (both supported ones).
func atLeast(v, w string) bool {
	return slices.Index(SupportedVersions, v) >= slices.Index(SupportedVersions, w)
}

// needVersion refuses cmd for a config older than the version that has it.
func needVersion(c NetConf, cmd, since string) error {
	if !atLeast(c.CNIVersion, since) {
		return errorf(ErrIncompatibleVersion, "%s needs cniVersion %s or later; the network config has %s", cmd, since, c.CNIVersion)
	}
	return nil
}

// String names the network in messages.
func (c NetConf) String() string { return fmt.Sprintf("network %s (%s/%s)", c.Name, c.Farm, c.Subnet) }
