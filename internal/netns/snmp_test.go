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

const netstatSample = `TcpExt: SyncookiesSent SyncookiesRecv OutOfWindowIcmps LockDroppedIcmps
TcpExt: 0 0 5 1
IpExt: InNoRoutes InTruncatedPkts
IpExt: 3 0
`

func TestSNMPCounterReadsTheFieldOfItsProtocol(t *testing.T) {
	for _, c := range []struct {
		table, proto, field string
		want                uint64
		err                 string
	}{
		{snmpSample, "Udp", "InCsumErrors", 7, ""},
		{snmpSample, "Udp", "InDatagrams", 10, ""},
		{snmpSample, "Ip", "InReceives", 1234, ""},
		{snmpSample, "Udp", "Nothing", 0, "no Udp Nothing"},
		{snmpSample, "Tcp", "InCsumErrors", 0, "no Tcp InCsumErrors"},
		{netstatSample, "TcpExt", "OutOfWindowIcmps", 5, ""},
		{netstatSample, "IpExt", "InNoRoutes", 3, ""},
		{netstatSample, "TcpExt", "InNoRoutes", 0, "no TcpExt InNoRoutes"},
	} {
		got, err := snmpCounter(strings.NewReader(c.table), c.proto, c.field)
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
