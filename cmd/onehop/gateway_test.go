package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
)

// `onehop gateway run` checks every flag before it touches the namespace
// and names the flag at fault; `gateway status` without a daemon says
// what to start.
func TestCLIGatewayRunNamesTheBadFlag(t *testing.T) {
	base := []string{"gateway", "run", "--intercept", "eth0", "--eid-prefix", "10.77.0.0/24",
		"--path", "dev=wan1,eid=10.77.0.1,rloc=192.0.2.1", "--map", "10.88.0.0/24=192.0.2.2"}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no intercept", []string{"gateway", "run", "--eid-prefix", "10.77.0.0/24", "--path", "dev=wan1,eid=10.77.0.1", "--map", "10.88.0.0/24=192.0.2.2"}, "--intercept"},
		{"bad prefix", append(base, "--eid-prefix", "10.77.0/24"), "--eid-prefix"},
		{"bad path", append(base, "--path", "dev=wan2"), "--path \"dev=wan2\": no eid="},
		{"eid outside", append(base, "--path", "dev=wan2,eid=10.78.0.2"), "--path eid=10.78.0.2: not inside --eid-prefix"},
		{"bad map", append(base, "--map", "10.88.0.0/24=x"), "--map"},
		{"bad resolver", append(base, "--map-resolver", "nope"), "--map-resolver \"nope\""},
		{"bad fwmark", append(base, "--fwmark", "red"), "--fwmark"},
		{"lisp without rloc", append(base, "--lisp", "--path", "dev=wan2,eid=10.77.0.2"), "--path dev=wan2: --lisp needs rloc="},
		{"whole superpackets without lisp", append(base, "--whole-superpackets"), "--whole-superpackets: only with --lisp"},
		{"map-server without key", append(base, "--lisp", "--map-server", "192.0.2.9"), "--map-server-key"},
		{"missing key file", append(base, "--lisp", "--map-server", "192.0.2.9", "--map-server-key-file", "/nonexistent/key"), "--map-server-key-file"},
		{"key twice", append(base, "--lisp", "--map-server", "192.0.2.9", "--map-server-key", "k", "--map-server-key-file", "/nonexistent/key"), "--map-server-key-file: give the key once"},
		{"no mapping system", []string{"gateway", "run", "--intercept", "eth0", "--eid-prefix", "10.77.0.0/24", "--path", "dev=wan1,eid=10.77.0.1"}, "--map-resolver or --map"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := newRootCmd()
			root.SetArgs(tc.args)
			var out bytes.Buffer
			root.SetOut(&out)
			root.SetErr(&out)
			err := root.Execute()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("want an error naming %q, got %v", tc.want, err)
			}
		})
	}
	root := newRootCmd()
	root.SetArgs([]string{"gateway", "status", "--control", filepath.Join(t.TempDir(), "none.sock")})
	err := root.Execute()
	if err == nil || !strings.Contains(err.Error(), "onehop gateway run") {
		t.Fatalf("status without a daemon: %v", err)
	}
}
