package main

import (
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strconv"
)

// Summary is the spread of one figure over the rounds.
type Summary struct {
	Min    float64 `json:"min"`
	Median float64 `json:"median"`
	Max    float64 `json:"max"`
	N      int     `json:"n"`
}

// Summarize returns min, median and max of xs.
func Summarize(xs []float64) Summary {
	if len(xs) == 0 {
		return Summary{}
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return Summary{Min: s[0], Median: med, Max: s[len(s)-1], N: len(s)}
}

// Ratio is a/b, or 0 when b is 0.
func Ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// iperfTCP extracts the receiver's throughput in bit/s from `iperf3 -J`.
func iperfTCP(out []byte) (float64, error) {
	var r struct {
		End struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
		Error string `json:"error"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		return 0, fmt.Errorf("iperf3 json: %w", err)
	}
	if r.Error != "" {
		return 0, fmt.Errorf("iperf3: %s", r.Error)
	}
	if r.End.SumReceived.BitsPerSecond == 0 {
		return 0, fmt.Errorf("iperf3 reported no received data")
	}
	return r.End.SumReceived.BitsPerSecond, nil
}

// iperfUDPReceivedPPS extracts datagrams per second that reached the server
// from `iperf3 -u -J`: the client's end summary carries the server's view
// (packets sent minus lost_packets counted by the receiver), which is the
// rate the path delivered, not the rate the sender managed to offer.
func iperfUDPReceivedPPS(out []byte) (float64, error) {
	var r struct {
		End struct {
			Sum struct {
				Seconds     float64 `json:"seconds"`
				Packets     float64 `json:"packets"`
				LostPackets float64 `json:"lost_packets"`
			} `json:"sum"`
		} `json:"end"`
		Error string `json:"error"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		return 0, fmt.Errorf("iperf3 json: %w", err)
	}
	if r.Error != "" {
		return 0, fmt.Errorf("iperf3: %s", r.Error)
	}
	s := r.End.Sum
	if s.Seconds <= 0 || s.Packets <= 0 {
		return 0, fmt.Errorf("iperf3 reported no UDP packets")
	}
	return (s.Packets - s.LostPackets) / s.Seconds, nil
}

var rttRE = regexp.MustCompile(`rtt min/avg/max/mdev = ([0-9.]+)/([0-9.]+)/([0-9.]+)/([0-9.]+) ms`)
var lossRE = regexp.MustCompile(`(\d+) packets transmitted, (\d+) received`)

// pingAvgMicros extracts the average RTT in µs from `ping -q`, and fails if
// any echo was lost (a lossy path has no meaningful RTT).
func pingAvgMicros(out []byte) (float64, error) {
	l := lossRE.FindSubmatch(out)
	if l == nil {
		return 0, fmt.Errorf("no ping summary in %q", out)
	}
	if string(l[1]) != string(l[2]) {
		return 0, fmt.Errorf("ping lost packets: %s sent, %s received", l[1], l[2])
	}
	m := rttRE.FindSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("no rtt line in %q", out)
	}
	avg, err := strconv.ParseFloat(string(m[2]), 64)
	return avg * 1000, err
}
