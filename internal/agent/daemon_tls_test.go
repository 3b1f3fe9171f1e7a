package agent

import (
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/pki"
)

func TestAgentRefusesToDialEtcdWithoutTLSUnlessInsecure(t *testing.T) {
	files := pki.Files{CA: "ca.crt", Cert: "agent-h1.crt", Key: "agent-h1.key"}
	base := DaemonConfig{Config: Config{Node: "h1"}, BPFFS: "/b", EtcdEndpoints: []string{"https://192.168.100.1:2379"}, TLS: files}
	cases := []struct {
		name string
		edit func(*DaemonConfig)
		want string
	}{
		{"tls", func(c *DaemonConfig) {}, ""},
		{"no tls material", func(c *DaemonConfig) { c.TLS = pki.Files{} }, "the agent dials etcd over TLS with client certificates: pass --tls-ca"},
		{"insecure", func(c *DaemonConfig) {
			c.TLS, c.Insecure, c.EtcdEndpoints = pki.Files{}, true, []string{"http://192.168.100.1:2379"}
		}, ""},
		{"insecure with files", func(c *DaemonConfig) { c.Insecure = true }, "--insecure contradicts"},
		{"cert without key", func(c *DaemonConfig) { c.TLS.Key = "" }, "--tls-key missing"},
		{"plain endpoint", func(c *DaemonConfig) { c.EtcdEndpoints = []string{"http://192.168.100.1:2379"} }, "plain http needs --insecure"},
		{"tls endpoint, insecure", func(c *DaemonConfig) { c.TLS, c.Insecure = pki.Files{}, true }, "https with --insecure"},
	}
	for _, c := range cases {
		cfg := base
		c.edit(&cfg)
		err := cfg.Validate()
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
}

func TestAgentNamesAnUnreadableTLSFileBeforeTouchingTheKernel(t *testing.T) {
	cfg := DaemonConfig{Config: Config{Node: "h1"}, BPFFS: "/b", EtcdEndpoints: []string{"https://192.168.100.1:2379"},
		TLS: pki.Files{CA: filepath.Join(t.TempDir(), "missing-ca.crt"), Cert: "c", Key: "k"}}
	mounted := false
	err := RunDaemon(t.Context(), cfg, func(string) error { mounted = true; return nil }, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err == nil || !strings.Contains(err.Error(), "missing-ca.crt") {
		t.Errorf("missing CA file: %v", err)
	}
	if mounted {
		t.Error("the agent mounted its bpffs before checking its TLS files")
	}
}
