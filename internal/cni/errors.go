// Package cni is onehop's CNI plugin (CNI spec 1.1): a container runtime
// runs the onehop binary with CNI_COMMAND set, and each command becomes
// calls to the controller's API (the container is a VM in the intent) and
// to the host's links (a veth whose host end the agent attaches to). This
// package holds the plugin's logic: the network configuration and the
// environment, checked with errors that name what is wrong, the VM's name,
// the result, and the commands against two seams (Controller, Links). The
// links themselves are made by internal/cnilink.
package cni

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// Error codes of the CNI spec (1-99) and onehop's own (100 and up).
const (
	ErrIncompatibleVersion uint = 1  // the config's cniVersion is not one this plugin speaks
	ErrUnsupportedField    uint = 2  // a field of the config this plugin does not know
	ErrUnknownContainer    uint = 3  // CNI_NETNS names no namespace
	ErrInvalidEnvironment  uint = 4  // a CNI_* variable missing or malformed
	ErrIOFailure           uint = 5  // a link could not be made, read or removed
	ErrDecodingFailure     uint = 6  // stdin is not the JSON it should be
	ErrInvalidConfig       uint = 7  // a field of the config has a bad value (or names what does not exist)
	ErrTryAgainLater       uint = 11 // the controller did not answer
	ErrNotAvailable        uint = 50 // STATUS: ADD would fail now
	// ErrControllerRefused is an API error the plugin cannot put on one
	// field of its config (the host holds as many VMs as it can, ...).
	ErrControllerRefused uint = 100
	// ErrNotAttached is an ADD whose veth the host's agent did not attach
	// within attachTimeout: the container would have no network.
	ErrNotAttached uint = 101
	// ErrCheckFailed is a CHECK that found the container's network other
	// than the intent and the ADD's result say.
	ErrCheckFailed uint = 102
)

// Error is a CNI error object: what the plugin writes to stdout, with a
// non-zero exit status, when a command fails.
type Error struct {
	Code    uint   `json:"code"`
	Msg     string `json:"msg"`
	Details string `json:"details,omitempty"`
}

func (e *Error) Error() string {
	if e.Details != "" {
		return e.Msg + ": " + e.Details
	}
	return e.Msg
}

// errorf is an Error with code whose message is formatted.
func errorf(code uint, format string, a ...any) *Error {
	return &Error{Code: code, Msg: fmt.Sprintf(format, a...)}
}

// asError is err as a CNI error: itself when it is one, else code with
// err's text.
func asError(err error, code uint) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return &Error{Code: code, Msg: err.Error()}
}

// writeError writes e as the spec's error object for version.
func writeError(w io.Writer, version string, e *Error) {
	out := struct {
		CNIVersion string `json:"cniVersion"`
		*Error
	}{version, e}
	b, _ := json.Marshal(out)
	w.Write(append(b, '\n'))
}
