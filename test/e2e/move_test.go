package e2e

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

const threeHosts = `name: %s
hosts: [{name: h1}, {name: h2}, {name: h3}]
farms:
  - name: blue
    subnets: [{name: web}]
vms:
  - {name: web1, host: h1, subnet: blue/web}
  - {name: web2, host: h2, subnet: blue/web}
`

func TestPrivilegedMovedVMKeepsItsAddressAndItsTCPConnection(t *testing.T) {
	l := upLab(t, threeHosts)
	web1 := l.ip("web1")
	l.start("web1", "iperf3", "-s", "-1")
	waitFor(t, "iperf3 on web1", 5*time.Second, func() bool {
		o, _ := l.in("web1", "ss", "-ltn", "sport = :5201")
		return strings.Contains(o, "5201")
	})
	// A 6-second TCP stream from web2, with web1 moved to h3 in the middle.
	client := l.start("web2", "iperf3", "-c", web1, "-t", "6", "-C", "cubic", "-J")
	waitFor(t, "the stream from web2 to be established and moving", 5*time.Second, func() bool {
		o, _ := l.in("web2", "ss", "-tni", "state", "established", "dport", "= :5201")
		return strings.Contains(o, "bytes_acked:") && !strings.Contains(o, "bytes_acked:0 ")
	})
	h2Before := l.metrics("h2")
	moved := time.Now()
	l.onehop("lab", "move", "web1", "--to", "h3")
	waitFor(t, "web2 to reach web1 on h3", 10*time.Second, func() bool {
		return l.ping("web2", web1, 1) == nil
	})
	t.Logf("web1 reachable on h3 %.2fs after the move began", time.Since(moved).Seconds())
	// h3 announced its new VM; h2, which was sending to web1, corrected its
	// mapping from that announcement rather than waiting for a refresh.
	if n := l.metrics("h3").at(arpEvent("announced")); n < 1 {
		t.Errorf("h3 announced %v VMs after web1 arrived", n)
	}
	if d := l.metrics("h2").at(forwards("arp_learned")) - h2Before.at(forwards("arp_learned")); d < 1 {
		t.Errorf("h2 learned nothing from the fabric after the move (arp_learned +%v)", d)
	}

	waitFor(t, "the TCP stream to finish", 20*time.Second, func() bool {
		return strings.Contains(client.Output(), `"sum_received"`)
	})
	var res struct {
		Intervals []struct {
			Sum struct {
				Start float64 `json:"start"`
				Bytes float64 `json:"bytes"`
			} `json:"sum"`
		} `json:"intervals"`
		End struct {
			SumReceived struct {
				Bytes float64 `json:"bytes"`
			} `json:"sum_received"`
		} `json:"end"`
		Error string `json:"error"`
	}
	out := client.Stop()
	if err := json.Unmarshal([]byte(out[strings.Index(out, "{"):]), &res); err != nil {
		t.Fatalf("iperf3 output: %v\n%s", err, out)
	}
	if res.Error != "" {
		t.Fatalf("the TCP connection broke across the move: %s", res.Error)
	}
	var after float64
	for _, iv := range res.Intervals {
		if iv.Sum.Start >= 4 {
			after += iv.Sum.Bytes
		}
	}
	if after == 0 {
		t.Errorf("no data flowed in the last seconds, after the move: %+v", res.Intervals)
	}
	l.refresh()
	if n := l.node("h3"); n.Agent == nil || len(n.Agent.AttachedVifs) != 1 || n.Agent.AttachedVifs[0] != "vif-web1" {
		t.Errorf("h3's agent does not hold web1's vif: %+v", n.Agent)
	}
	if n := l.node("web1"); n.VM == nil || n.VM.Host != "h3" || n.VM.IP != web1 {
		t.Errorf("web1 after the move: %+v", n.VM)
	}
}
