package netns

import (
	"strings"
	"testing"
)

const snmpSample = `Ip: Forwarding DefaultTTL InReceives
Ip: 1 64 1234
Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors
Udp: 10 2 3 40 0 0 7
`

func TestSNMPCounterReadsTheFieldOfItsProtocol(t *testing.T) {
	for _, c := range []struct {
		proto, field string
		want         uint64
		err          string
	}{
		{"Udp", "InCsumErrors", 7, ""},
		{"Udp", "InDatagrams", 10, ""},
		{"Ip", "InReceives", 1234, ""},
		{"Udp", "Nothing", 0, "no Udp Nothing"},
		{"Tcp", "InCsumErrors", 0, "no Tcp InCsumErrors"},
	} {
		got, err := snmpCounter(strings.NewReader(snmpSample), c.proto, c.field)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s %s: err %v, want %q", c.proto, c.field, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%s %s = %d, %v; want %d", c.proto, c.field, got, err, c.want)
		}
	}
}
