package e2e

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/testenv"
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
	testenv.RequireTool(t, "iperf3")
	l := upLab(t, threeHosts)
	web1 := l.ip("web1")
	l.start("web1", "iperf3", "-s", "-1")
	l.waitListening("web1", "tcp", 5201)
	// A 6-second TCP stream from web2, with web1 moved to h3 while it runs.
	client := l.start("web2", "iperf3", "-c", web1, "-t", "6", "-C", "cubic", "-J")
	testenv.Eventually(t, "web2's TCP stream to web1 to carry data", 10*time.Second, func() error {
		acked, err := l.bytesAcked("web2", web1+":5201")
		if err == nil && acked < 1<<20 {
			err = fmt.Errorf("%d bytes acked so far", acked)
		}
		return err
	})
	streaming := time.Now()
	h2Before := l.metrics("h2")
	l.onehop("lab", "move", "web1", "--to", "h3")
	testenv.Eventually(t, "web2 to reach web1 on h3", 10*time.Second, func() bool {
		return l.ping("web2", web1, 1) == nil
	})
	movedAfter := time.Since(streaming)
	t.Logf("web1 reachable on h3 %.2fs into the stream", movedAfter.Seconds())
	// h3 announced its new VM; h2, which was sending to web1, corrected its
	// mapping from that announcement rather than waiting for a refresh.
	if n := l.metrics("h3").at(arpEvent("announced")); n < 1 {
		t.Errorf("h3 announced %v VMs after web1 arrived", n)
	}
	if d := rise(h2Before, l.metrics("h2"), forwards("arp_learned")); d < 1 {
		t.Errorf("h2 learned nothing from the fabric after the move (arp_learned +%v)", d)
	}

	testenv.Eventually(t, "the TCP stream to finish", 20*time.Second, func() bool {
		return strings.Contains(client.Output(), `"sum_received"`)
	})
	// Data must flow in the intervals that began once web1 answered on h3
	// (iperf3 counts from its start, which came less than a second before
	// the stream was seen carrying data).
	streamCarriedDataAfter(t, client.Stop(), movedAfter.Seconds()+1)
	l.refresh()
	if n := l.node("h3"); n.Agent == nil || len(n.Agent.AttachedVifs) != 1 || n.Agent.AttachedVifs[0] != blueWeb1Vif {
		t.Errorf("h3's agent does not hold web1's vif: %+v", n.Agent)
	}
	if n := l.node("web1"); n.VM == nil || n.VM.Host != "h3" || n.VM.IP != web1 {
		t.Errorf("web1 after the move: %+v", n.VM)
	}
}

// bytesAcked is the most bytes_acked among vm's established TCP
// connections to dst (ADDR:PORT).
func (l *testLab) bytesAcked(vm, dst string) (int64, error) {
	out, err := l.in(vm, "ss", "-Htin", "state", "established", "dst", dst)
	if err != nil {
		return 0, fmt.Errorf("ss: %v: %s", err, out)
	}
	var most int64 = -1
	for _, f := range strings.Fields(out) {
		if v, ok := strings.CutPrefix(f, "bytes_acked:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return 0, fmt.Errorf("ss: %q: %v", f, err)
			}
			most = max(most, n)
		}
	}
	if most < 0 {
		return 0, fmt.Errorf("no established connection to %s: %q", dst, out)
	}
	return most, nil
}

// streamCarriedDataAfter checks an iperf3 client's -J output (out): the
// connection did not break, and data flowed in the intervals that began
// from seconds into the stream on.
func streamCarriedDataAfter(t *testing.T, out string, from float64) {
	t.Helper()
	var res struct {
		Intervals []struct {
			Sum struct {
				Start float64 `json:"start"`
				Bytes float64 `json:"bytes"`
			} `json:"sum"`
		} `json:"intervals"`
		Error string `json:"error"`
	}
	i := strings.Index(out, "{")
	if i < 0 {
		t.Fatalf("iperf3 printed no JSON:\n%s", out)
	}
	if err := json.Unmarshal([]byte(out[i:]), &res); err != nil {
		t.Fatalf("iperf3 output: %v\n%s", err, out)
	}
	if res.Error != "" {
		t.Fatalf("the TCP connection broke across the move: %s", res.Error)
	}
	var after float64
	var counted int
	for _, iv := range res.Intervals {
		if iv.Sum.Start >= from {
			after += iv.Sum.Bytes
			counted++
		}
	}
	if counted == 0 {
		t.Fatalf("the move took %.1fs, past the end of the stream: nothing shows the connection carried data after it", from)
	}
	if after == 0 {
		t.Errorf("no data flowed in the %d intervals after the move: %+v", counted, res.Intervals)
	}
}
