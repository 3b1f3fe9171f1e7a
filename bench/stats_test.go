package main

import (
	"math"
	"testing"
)

func TestSummarize(t *testing.T) {
	cases := []struct {
		in   []float64
		want Summary
	}{
		{[]float64{3, 1, 2}, Summary{1, 2, 3, 3}},
		{[]float64{4, 1, 3, 2}, Summary{1, 2.5, 4, 4}},
		{[]float64{7}, Summary{7, 7, 7, 1}},
		{nil, Summary{}},
	}
	for _, c := range cases {
		if got := Summarize(c.in); got != c.want {
			t.Errorf("Summarize(%v) = %+v, want %+v", c.in, got, c.want)
		}
	}
	if Ratio(1, 0) != 0 || Ratio(3, 2) != 1.5 {
		t.Error("Ratio")
	}
}

func TestParsers(t *testing.T) {
	tcp := []byte(`{"end":{"sum_received":{"bits_per_second":1.5e10}}}`)
	if v, err := iperfTCP(tcp); err != nil || v != 1.5e10 {
		t.Errorf("tcp %v %v", v, err)
	}
	if _, err := iperfTCP([]byte(`{"error":"unable to connect"}`)); err == nil {
		t.Error("iperf3 error not reported")
	}
	udp := []byte(`{"end":{"sum":{"seconds":2,"packets":1000,"lost_packets":200}}}`)
	if v, err := iperfUDPReceivedPPS(udp); err != nil || v != 400 {
		t.Errorf("udp %v %v", v, err)
	}
	ping := []byte("50 packets transmitted, 50 received, 0% packet loss, time 600ms\nrtt min/avg/max/mdev = 0.031/0.052/0.120/0.010 ms\n")
	if v, err := pingAvgMicros(ping); err != nil || math.Abs(v-52) > 1e-9 {
		t.Errorf("ping %v %v", v, err)
	}
	lossy := []byte("50 packets transmitted, 48 received, 4% packet loss\nrtt min/avg/max/mdev = 0.031/0.052/0.120/0.010 ms\n")
	if _, err := pingAvgMicros(lossy); err == nil {
		t.Error("lossy ping accepted")
	}
}
