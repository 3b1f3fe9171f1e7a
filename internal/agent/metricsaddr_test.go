package agent

import (
	"net/netip"
	"strings"
	"testing"
)

// The metrics count every guest's traffic: no address a guest reaches is
// taken (issue 20, item 15). Slivers share the uplink's address.
func TestMetricsAddressAGuestCouldReachIsRefused(t *testing.T) {
	uplinks := []netip.Addr{netip.MustParseAddr("192.168.100.10"), netip.MustParseAddr("192.168.100.13")}
	for _, c := range []struct {
		addr, want string // want: a piece of the error, "" for none
	}{
		{DefaultMetricsAddr, ""},
		{"127.0.0.1:9100", ""},
		{"[::1]:9100", ""},
		{"10.20.0.5:9100", ""}, // a management address no guest shares
		{":9100", "listens on every address"},
		{"0.0.0.0:9100", "listens on every address"},
		{"[::]:9100", "listens on every address"},
		{"192.168.100.10:9100", "is an uplink's address"},
		{"192.168.100.13:9100", "is an uplink's address"}, // a second uplink's: slivers lease there too
		{"[::ffff:192.168.100.10]:9100", "is an uplink's address"},
		{"localhost:9100", "is not an IP address"},
		{"9100", "want IP:PORT"},
	} {
		err := CheckMetricsAddr(c.addr, uplinks)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%q refused: %v", c.addr, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%q: error %v, want one saying %q", c.addr, err, c.want)
		case c.want != "" && !strings.Contains(err.Error(), "--metrics-addr"):
			t.Errorf("%q: error %q does not name the flag", c.addr, err)
		}
	}
	// Validate refuses every address before anything starts.
	cfg := DaemonConfig{Config: Config{Node: "h1"}, EtcdEndpoints: []string{"http://127.0.0.1:2379"}, BPFFS: "/tmp/x", Insecure: true, MetricsAddr: ":9100"}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "--metrics-addr") {
		t.Errorf("Validate with --metrics-addr :9100: %v, want it refused", err)
	}
}
