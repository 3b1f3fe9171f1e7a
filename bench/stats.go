package main

// Pure helpers of the benchmark: statistics over the rounds, the ratio and
// target checks, and parsers for what iperf3, ping and `onehop lab status`
// print. Nothing here needs root or a network, so stats_test.go covers it.

import (
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// Summary is the spread of one figure of one variant over the rounds.
type Summary struct {
	Min    float64 `json:"min"`
	Median float64 `json:"median"`
	Max    float64 `json:"max"`
	N      int     `json:"n"`
}

// Summarize returns min, median and max of xs (the zero Summary if empty).
// The median of an even count is the mean of the two middle values.
func Summarize(xs []float64) Summary {
	if len(xs) == 0 {
		return Summary{}
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	mid := len(s) / 2
	med := s[mid]
	if len(s)%2 == 0 {
		med = (s[mid-1] + s[mid]) / 2
	}
	return Summary{Min: s[0], Median: med, Max: s[len(s)-1], N: len(s)}
}

// Percentile returns the p-th percentile of xs by nearest rank: the
// smallest sample that at least p% of the samples do not exceed (NaN if
// xs is empty). With fewer than 100 samples, p99 is the largest. It is
// internal/scale's definition, over float64.
func Percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	i := int(math.Ceil(float64(len(s)) * p / 100))
	return s[max(0, min(len(s)-1, i-1))]
}

// Ratio returns a/b, or NaN when either is missing (zero): a ratio against
// nothing must not read as a result.
func Ratio(a, b float64) float64 {
	if a == 0 || b == 0 {
		return math.NaN()
	}
	return a / b
}

// MeetsTarget tells whether ratio reaches target: at least target when
// higher is better (throughput), at most target when lower is better (RTT).
// A NaN ratio never does.
func MeetsTarget(ratio, target float64, lowerIsBetter bool) bool {
	if math.IsNaN(ratio) {
		return false
	}
	if lowerIsBetter {
		return ratio <= target
	}
	return ratio >= target
}

// Rotation returns the order in which n variants run in round r (0-based):
// round 0 runs 0,1,..,n-1, round 1 starts with 1, and so on, so that no
// variant always goes first (after setup) or last (after the others' load).
func Rotation(n, r int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = (i + r) % n
	}
	return out
}

// Measurement is one sample: the figure's value and, for the record, other
// numbers the same tool run reported.
type Measurement struct {
	Value float64            `json:"value"`
	Extra map[string]float64 `json:"extra,omitempty"`
}

// iperfResult is the part of `iperf3 -J` (client side) the bench reads.
type iperfResult struct {
	Error string `json:"error"`
	End   struct {
		SumSent     iperfSum `json:"sum_sent"`
		SumReceived iperfSum `json:"sum_received"`
		Sum         iperfSum `json:"sum"` // UDP: the client's count, with the server's lost_packets
	} `json:"end"`
}

type iperfSum struct {
	Seconds       float64 `json:"seconds"`
	Bytes         float64 `json:"bytes"`
	BitsPerSecond float64 `json:"bits_per_second"`
	Retransmits   float64 `json:"retransmits"`
	Packets       float64 `json:"packets"`
	LostPackets   float64 `json:"lost_packets"`
}

func parseIperf(out []byte) (*iperfResult, error) {
	var r iperfResult
	if err := json.Unmarshal(out, &r); err != nil {
		return nil, fmt.Errorf("iperf3 output is not JSON (%v): %.200q", err, out)
	}
	if r.Error != "" {
		return nil, fmt.Errorf("iperf3: %s", r.Error)
	}
	return &r, nil
}

// ParseIperfTCP returns the receiver's throughput in bit/s from the JSON of
// an `iperf3 -c ... -J` TCP test (end.sum_received.bits_per_second).
func ParseIperfTCP(out []byte) (Measurement, error) {
	r, err := parseIperf(out)
	if err != nil {
		return Measurement{}, err
	}
	bps := r.End.SumReceived.BitsPerSecond
	if bps <= 0 {
		return Measurement{}, fmt.Errorf("iperf3 reported no data received")
	}
	return Measurement{Value: bps, Extra: map[string]float64{
		"senderBitsPerSecond": r.End.SumSent.BitsPerSecond,
		"retransmits":         r.End.SumSent.Retransmits,
		"receivedBytes":       r.End.SumReceived.Bytes,
	}}, nil
}

// ParseIperfUDP returns the datagrams per second the receiver got in an
// `iperf3 -u -l LEN -b 0 -J` test.
//
// It uses the server-side receive count: end.sum_received.bytes, which the
// server counts as its reads arrive (each read is one datagram of exactly
// LEN bytes), over the server's seconds. The alternative, end.sum.packets
// minus lost_packets, mixes the client's send count with a loss figure the
// server infers from sequence-number gaps: datagrams dropped after the last
// one that arrived leave no gap, so that difference can overstate what got
// through. With -b 0 the sender offers more than the path delivers, so only
// the received rate measures the path. The sender's rate and the loss go to
// Extra for the record. Older iperf3 without sum_received for UDP fall back
// to packets minus lost_packets.
func ParseIperfUDP(out []byte, datagramLen int) (Measurement, error) {
	r, err := parseIperf(out)
	if err != nil {
		return Measurement{}, err
	}
	if datagramLen <= 0 {
		return Measurement{}, fmt.Errorf("datagram length %d", datagramLen)
	}
	sent := r.End.Sum
	if sent.Seconds <= 0 || sent.Packets <= 0 {
		return Measurement{}, fmt.Errorf("iperf3 reported no UDP datagrams sent")
	}
	extra := map[string]float64{
		"sentPacketsPerSecond": sent.Packets / sent.Seconds,
		"sentPackets":          sent.Packets,
		"lostPackets":          sent.LostPackets,
	}
	if rcv := r.End.SumReceived; rcv.Seconds > 0 && rcv.Bytes > 0 {
		return Measurement{Value: rcv.Bytes / float64(datagramLen) / rcv.Seconds, Extra: extra}, nil
	}
	got := sent.Packets - sent.LostPackets
	if got <= 0 {
		return Measurement{}, fmt.Errorf("iperf3: all %v UDP datagrams lost", sent.Packets)
	}
	return Measurement{Value: got / sent.Seconds, Extra: extra}, nil
}

var (
	pingReplyRE = regexp.MustCompile(`time=([0-9.]+) ms`)
	pingCountRE = regexp.MustCompile(`(\d+) packets transmitted, (\d+) (?:packets )?received`)
	pingRTTRE   = regexp.MustCompile(`(?:rtt|round-trip) min/avg/max(?:/mdev|/stddev)? = ([0-9.]+)/([0-9.]+)/([0-9.]+)(?:/([0-9.]+))? ms`)
)

// ParsePing returns the average RTT in µs: the mean of the per-reply times
// when the output has them, else the summary's average.
// Lost echoes are not an error (the average is over those that came back),
// but they are reported in Extra["lost"] so a lossy path shows; all lost is.
func ParsePing(out []byte) (Measurement, error) {
	c := pingCountRE.FindSubmatch(out)
	if c == nil {
		return Measurement{}, fmt.Errorf("no ping summary in %.200q", out)
	}
	sent, _ := strconv.Atoi(string(c[1]))
	got, _ := strconv.Atoi(string(c[2]))
	if got == 0 {
		return Measurement{}, fmt.Errorf("ping: all %d echoes lost", sent)
	}
	m := pingRTTRE.FindSubmatch(out)
	if m == nil {
		return Measurement{}, fmt.Errorf("no rtt line in %.200q", out)
	}
	ms := make([]float64, 4)
	for i := range ms {
		if len(m[i+1]) > 0 {
			v, err := strconv.ParseFloat(string(m[i+1]), 64)
			if err != nil {
				return Measurement{}, fmt.Errorf("ping rtt %q: %w", m[i+1], err)
			}
			ms[i] = v * 1000 // ms -> µs
		}
	}
	avg := ms[1]
	// ping prints its average truncated to whole µs, which is coarse at
	// ~10 µs; the mean of the per-reply times (when ping ran without -q)
	// is not.
	if replies := pingReplyRE.FindAllSubmatch(out, -1); len(replies) > 0 {
		sum := 0.0
		for _, r := range replies {
			v, err := strconv.ParseFloat(string(r[1]), 64)
			if err != nil {
				return Measurement{}, fmt.Errorf("ping reply time %q: %w", r[1], err)
			}
			sum += v * 1000
		}
		avg = sum / float64(len(replies))
	}
	return Measurement{Value: avg, Extra: map[string]float64{
		"minMicros": ms[0], "maxMicros": ms[2], "mdevMicros": ms[3],
		"sent": float64(sent), "lost": float64(sent - got),
	}}, nil
}

// labStatus is the part of `onehop lab status -o json` the bench reads.
type labStatus struct {
	Nodes []struct {
		Name string `json:"name"`
		VM   *struct {
			IP string `json:"ip"`
		} `json:"vm"`
		Interfaces []struct {
			Name  string   `json:"name"`
			Addrs []string `json:"addrs"`
		} `json:"interfaces"`
	} `json:"nodes"`
}

// VMAddress returns the IPv4 address of VM node in the JSON of `onehop lab
// status -o json`: nodes[].vm.ip, which the controller allocated. A bridge
// lab runs no controller, so its status has no vm record; then the address
// configured on the VM's eth0 is the answer.
func VMAddress(statusJSON []byte, node string) (string, error) {
	var st labStatus
	if err := json.Unmarshal(statusJSON, &st); err != nil {
		return "", fmt.Errorf("lab status is not JSON: %w", err)
	}
	for _, n := range st.Nodes {
		if n.Name != node {
			continue
		}
		if n.VM != nil && n.VM.IP != "" {
			return n.VM.IP, nil
		}
		for _, ifc := range n.Interfaces {
			if ifc.Name == "eth0" && len(ifc.Addrs) > 0 {
				ip, _, _ := strings.Cut(ifc.Addrs[0], "/")
				return ip, nil
			}
		}
		return "", fmt.Errorf("lab status: node %s has no address", node)
	}
	return "", fmt.Errorf("lab status: no node %s", node)
}

// Combine merges the measurements of pairs that ran at once into the
// variant's sample: rates add up (tcp, udp64), RTTs average. Each pair's own
// value stays in Extra as pairN.
func Combine(figure string, ms []Measurement) Measurement {
	if len(ms) == 1 {
		return ms[0]
	}
	out := Measurement{Extra: map[string]float64{}}
	for i, m := range ms {
		out.Value += m.Value
		out.Extra[fmt.Sprintf("pair%d", i+1)] = m.Value
		for k, v := range m.Extra {
			out.Extra[fmt.Sprintf("pair%d.%s", i+1, k)] = v
		}
	}
	if figure == "rtt" && len(ms) > 0 {
		out.Value /= float64(len(ms))
	}
	return out
}

// NodeAddress returns the first IPv4 address on interface ifname of node in
// the JSON of `onehop lab status -o json` (a host's uplink0, say).
func NodeAddress(statusJSON []byte, node, ifname string) (string, error) {
	var st labStatus
	if err := json.Unmarshal(statusJSON, &st); err != nil {
		return "", fmt.Errorf("lab status is not JSON: %w", err)
	}
	for _, n := range st.Nodes {
		if n.Name != node {
			continue
		}
		for _, ifc := range n.Interfaces {
			if ifc.Name != ifname {
				continue
			}
			for _, a := range ifc.Addrs {
				if ip, _, _ := strings.Cut(a, "/"); !strings.Contains(ip, ":") {
					return ip, nil
				}
			}
		}
		return "", fmt.Errorf("lab status: node %s has no IPv4 address on %s", node, ifname)
	}
	return "", fmt.Errorf("lab status: no node %s", node)
}
