package main

import (
	"math"
	"reflect"
	"strings"
	"testing"
)

func TestSummarize(t *testing.T) {
	for _, c := range []struct {
		name string
		in   []float64
		want Summary
	}{
		{"odd count", []float64{3, 1, 2}, Summary{Min: 1, Median: 2, Max: 3, N: 3}},
		{"even count: mean of the middle two", []float64{4, 1, 3, 2}, Summary{Min: 1, Median: 2.5, Max: 4, N: 4}},
		{"one sample", []float64{7}, Summary{Min: 7, Median: 7, Max: 7, N: 1}},
		{"outlier does not move the median", []float64{10, 11, 12, 13, 1000}, Summary{Min: 10, Median: 12, Max: 1000, N: 5}},
		{"empty", nil, Summary{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			in := append([]float64(nil), c.in...)
			if got := Summarize(in); got != c.want {
				t.Errorf("Summarize(%v) = %+v, want %+v", c.in, got, c.want)
			}
			if !reflect.DeepEqual(in, c.in) && c.in != nil {
				t.Errorf("Summarize reordered its input: %v", in)
			}
		})
	}
}

func TestPercentileIsNearestRank(t *testing.T) {
	fifty := make([]float64, 50)
	for i := range fifty {
		fifty[i] = float64(50 - i) // 50 .. 1, unsorted
	}
	hundred := make([]float64, 100)
	for i := range hundred {
		hundred[i] = float64(i + 1)
	}
	for _, c := range []struct {
		name string
		in   []float64
		p    float64
		want float64
	}{
		{"p99 of 50 is the largest", fifty, 99, 50},
		{"p50 of 50 is the 25th", fifty, 50, 25},
		{"p99 of 100 is the 99th", hundred, 99, 99},
		{"p100 is the largest", hundred, 100, 100},
		{"p0 is the smallest", fifty, 0, 1},
		{"one sample", []float64{7}, 99, 7},
	} {
		t.Run(c.name, func(t *testing.T) {
			in := append([]float64(nil), c.in...)
			if got := Percentile(in, c.p); got != c.want {
				t.Errorf("Percentile(p%v) = %v, want %v", c.p, got, c.want)
			}
			if !reflect.DeepEqual(in, c.in) {
				t.Error("Percentile reordered its input")
			}
		})
	}
	if got := Percentile(nil, 50); !math.IsNaN(got) {
		t.Errorf("Percentile of nothing = %v, want NaN", got)
	}
}

func TestRatioAndTarget(t *testing.T) {
	for _, c := range []struct {
		name          string
		a, b          float64
		target        float64
		lowerIsBetter bool
		wantRatio     float64 // NaN: no ratio
		wantMet       bool
	}{
		{"throughput above target", 3, 2, 1.0, false, 1.5, true},
		{"throughput exactly at target", 2, 2, 1.0, false, 1, true},
		{"throughput below target", 1, 2, 1.0, false, 0.5, false},
		{"rtt within 5%", 104, 100, 1.05, true, 1.04, true},
		{"rtt above 5%", 110, 100, 1.05, true, 1.1, false},
		{"missing baseline", 1, 0, 1.0, false, math.NaN(), false},
		{"missing onehop", 0, 1, 1.05, true, math.NaN(), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := Ratio(c.a, c.b)
			if math.IsNaN(c.wantRatio) != math.IsNaN(r) || (!math.IsNaN(r) && math.Abs(r-c.wantRatio) > 1e-12) {
				t.Errorf("Ratio(%v, %v) = %v, want %v", c.a, c.b, r, c.wantRatio)
			}
			if got := MeetsTarget(r, c.target, c.lowerIsBetter); got != c.wantMet {
				t.Errorf("MeetsTarget(%v, %v, lower=%v) = %v, want %v", r, c.target, c.lowerIsBetter, got, c.wantMet)
			}
		})
	}
}

func TestRotation(t *testing.T) {
	for _, c := range []struct {
		n, r int
		want []int
	}{
		{3, 0, []int{0, 1, 2}},
		{3, 1, []int{1, 2, 0}},
		{3, 2, []int{2, 0, 1}},
		{3, 3, []int{0, 1, 2}},
		{1, 4, []int{0}},
	} {
		if got := Rotation(c.n, c.r); !reflect.DeepEqual(got, c.want) {
			t.Errorf("Rotation(%d, %d) = %v, want %v", c.n, c.r, got, c.want)
		}
	}
}

// Shapes of iperf3 3.12 -J output, cut down to the fields the bench reads.
const (
	iperfTCPOut = `{"start":{},"end":{
		"sum_sent":{"seconds":3,"bytes":7e9,"bits_per_second":1.9e10,"retransmits":12,"sender":true},
		"sum_received":{"seconds":3.0004,"bytes":6.9e9,"bits_per_second":1.8e10,"sender":true}}}`
	iperfUDPOut = `{"end":{
		"sum":{"seconds":2.000183,"bytes":30380800,"packets":474700,"lost_packets":6659,"sender":true},
		"sum_sent":{"seconds":2.000027,"bytes":30380800,"packets":474700,"lost_packets":0,"sender":true},
		"sum_received":{"seconds":2.000183,"bytes":29954624,"packets":474700,"lost_packets":6659,"sender":false}}}`
	// A tail of datagrams lost after the last one that arrived leaves no
	// sequence gap: packets-lost says 1000, the server read only 900.
	iperfUDPTailLoss = `{"end":{
		"sum":{"seconds":1,"packets":1100,"lost_packets":100},
		"sum_received":{"seconds":1,"bytes":57600}}}`
	iperfUDPOld   = `{"end":{"sum":{"seconds":2,"packets":1000,"lost_packets":200}}}`
	iperfRefused  = `{"start":{},"intervals":[],"end":{},"error":"unable to connect to server: Connection refused"}`
	iperfNoData   = `{"end":{"sum_received":{"bits_per_second":0}}}`
	pingOK        = "PING 10.1.1.3 (10.1.1.3) 56(84) bytes of data.\n\n--- 10.1.1.3 ping statistics ---\n50 packets transmitted, 50 received, 0% packet loss, time 502ms\nrtt min/avg/max/mdev = 0.064/0.093/0.247/0.023 ms\n"
	pingLossy     = "50 packets transmitted, 48 received, 4% packet loss, time 600ms\nrtt min/avg/max/mdev = 0.031/0.052/0.120/0.010 ms\n"
	pingReplies   = "64 bytes from 10.1.1.3: icmp_seq=1 ttl=64 time=0.009 ms\n64 bytes from 10.1.1.3: icmp_seq=2 ttl=64 time=0.010 ms\n64 bytes from 10.1.1.3: icmp_seq=3 ttl=64 time=0.010 ms\n\n3 packets transmitted, 3 received, 0% packet loss, time 1ms\nrtt min/avg/max/mdev = 0.009/0.009/0.010/0.000 ms\n"
	pingBusybox   = "3 packets transmitted, 3 packets received, 0% packet loss\nround-trip min/avg/max = 0.050/0.060/0.070 ms\n"
	pingAllLost   = "50 packets transmitted, 0 received, 100% packet loss, time 1000ms\n"
	pingTruncated = "PING 10.1.1.3 (10.1.1.3) 56(84) bytes of data.\n"
)

func TestParsers(t *testing.T) {
	tcp := func(out string) (Measurement, error) { return ParseIperfTCP([]byte(out)) }
	udp := func(out string) (Measurement, error) { return ParseIperfUDP([]byte(out), 64) }
	ping := func(out string) (Measurement, error) { return ParsePing([]byte(out)) }
	for _, c := range []struct {
		name      string
		parse     func(string) (Measurement, error)
		in        string
		want      float64
		wantExtra map[string]float64 // checked keys only
		wantErr   string
	}{
		{"tcp: receiver bits/s", tcp, iperfTCPOut, 1.8e10, map[string]float64{"retransmits": 12, "senderBitsPerSecond": 1.9e10}, ""},
		{"tcp: iperf3 error surfaces", tcp, iperfRefused, 0, nil, "Connection refused"},
		{"tcp: nothing received", tcp, iperfNoData, 0, nil, "no data received"},
		{"tcp: not JSON", tcp, "iperf3: error - the server is busy", 0, nil, "not JSON"},
		{"udp: server-side receive count", udp, iperfUDPOut, 29954624.0 / 64 / 2.000183, map[string]float64{"lostPackets": 6659}, ""},
		{"udp: tail loss is not counted as received", udp, iperfUDPTailLoss, 900, nil, ""},
		{"udp: old iperf3 without sum_received", udp, iperfUDPOld, 400, nil, ""},
		{"udp: iperf3 error surfaces", udp, iperfRefused, 0, nil, "Connection refused"},
		{"udp: nothing sent", udp, `{"end":{}}`, 0, nil, "no UDP datagrams"},
		{"ping: avg in µs", ping, pingOK, 93, map[string]float64{"minMicros": 64, "maxMicros": 247, "lost": 0}, ""},
		{"ping: loss is recorded, not fatal", ping, pingLossy, 52, map[string]float64{"lost": 2, "sent": 50}, ""},
		{"ping: busybox summary", ping, pingBusybox, 60, nil, ""},
		{"ping: per-reply mean beats the truncated summary", ping, pingReplies, 29.0 / 3, nil, ""},
		{"ping: all lost", ping, pingAllLost, 0, nil, "all 50 echoes lost"},
		{"ping: no summary", ping, pingTruncated, 0, nil, "no ping summary"},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, err := c.parse(c.in)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if math.Abs(m.Value-c.want) > 1e-6*math.Max(1, c.want) {
				t.Errorf("value = %v, want %v", m.Value, c.want)
			}
			for k, want := range c.wantExtra {
				if got, ok := m.Extra[k]; !ok || math.Abs(got-want) > 1e-6*math.Max(1, want) {
					t.Errorf("extra[%s] = %v (present %v), want %v", k, got, ok, want)
				}
			}
		})
	}
}

func TestVMAddress(t *testing.T) {
	onehopLab := `{"name":"benchoh","nodes":[
		{"name":"fabric","kind":"fabric","interfaces":[{"name":"br0","addrs":[]}]},
		{"name":"vm2","kind":"vm","vm":{"name":"vm2","ip":"10.1.1.3"},"interfaces":[{"name":"eth0","addrs":["10.1.1.99/24"]}]}]}`
	bridgeLab := `{"name":"benchbr","nodes":[
		{"name":"h2","kind":"vm","interfaces":[{"name":"br0","addrs":["192.168.100.11/24"]}]},
		{"name":"vm2","kind":"vm","interfaces":[{"name":"eth0","addrs":["10.1.1.3/24"]}]}]}`
	noAddr := `{"nodes":[{"name":"vm2","interfaces":[{"name":"eth0","addrs":[]}]}]}`
	for _, c := range []struct {
		name, in, node, want, wantErr string
	}{
		{"controller's allocation wins", onehopLab, "vm2", "10.1.1.3", ""},
		{"bridge lab: eth0's address", bridgeLab, "vm2", "10.1.1.3", ""},
		{"a host is not taken for the VM", bridgeLab, "vm1", "", "no node vm1"},
		{"VM without address (dhcp not done)", noAddr, "vm2", "", "no address"},
		{"not JSON", "lab: no lab named", "vm2", "", "not JSON"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := VMAddress([]byte(c.in), c.node)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, c.wantErr)
				}
				return
			}
			if err != nil || got != c.want {
				t.Errorf("VMAddress = %q, %v; want %q", got, err, c.want)
			}
		})
	}
}
