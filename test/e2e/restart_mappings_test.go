package e2e

import (
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/onehop/onehop/internal/datapath"
	"github.com/onehop/onehop/internal/testenv"
)

// Issue 12: an agent restart with 200,000 learned mappings does not
// interrupt traffic (OVN's anchor: an 8-minute outage at that size). h1's
// mapping table is filled with 200,000 entries the way the datapath learns
// them, a ping runs every 5 ms from web1 (h1) to web2 (h2) through both
// datapaths, and h1's agent is restarted: not one echo may go unanswered,
// the table must still hold what it learned, and the new agent's time to
// its first reconcile is reported.
func TestPrivilegedAgentRestartWith200000MappingsLosesNoPacket(t *testing.T) {
	const learned = 200_000
	l := upLab(t, quickstart+"arp: {table_size: 262144}\n")
	web2 := l.ip("web2")
	if err := l.ping("web1", web2, 2); err != nil {
		t.Fatal(err)
	}
	pin := filepath.Join(testRoot, l.name, "bpffs", "h1", "maps", "mappings")
	table, err := ebpf.LoadPinnedMap(pin, nil)
	if err != nil {
		t.Fatalf("h1's pinned mapping table: %v", err)
	}
	defer table.Close()
	if table.MaxEntries() != 262144 {
		t.Fatalf("h1's mapping table holds %d entries, want the topology's 262144", table.MaxEntries())
	}
	h2MAC, err := net.ParseMAC(l.mac("h2", "uplink0"))
	if err != nil {
		t.Fatal(err)
	}
	fillMappings(t, table, learned, h2MAC)
	before := countMappings(t, table)
	if before < learned {
		t.Fatalf("mapping table holds %d after the fill, want at least %d", before, learned)
	}

	agent := l.node("h1").Process
	logPath := agent.Log
	logBefore, err := os.ReadFile(logPath)
	if err != nil {
		t.Fatal(err)
	}
	pinger := l.start("web1", "ping", "-i", "0.005", "-W", "1", web2)
	testenv.Eventually(t, "web1's 5 ms ping to be answered", 5*time.Second, func() bool { return pingReplies(pinger.Output()) >= 50 })

	t0 := time.Now()
	l.onehop("lab", "restart", "h1")
	l.refresh()
	newAgent := l.node("h1").Process
	if newAgent.PID == agent.PID {
		t.Fatalf("agent pid unchanged (%d): restart did not happen", agent.PID)
	}
	var ready time.Duration
	testenv.Eventually(t, "the restarted agent's first reconcile", 60*time.Second, func() bool {
		b, err := os.ReadFile(logPath)
		if err != nil || len(b) < len(logBefore) {
			return false
		}
		if strings.Contains(string(b[len(logBefore):]), "datapath reconciled") {
			ready = time.Since(t0)
			return true
		}
		return false
	})
	atRestart := pingReplies(pinger.Output())
	testenv.Eventually(t, "400 more ping replies after the restart (2 s)", 20*time.Second, func() bool {
		return pingReplies(pinger.Output()) >= atRestart+400
	})
	// The new agent at work with the full table (its ARP engine reads it
	// every second): its CPU over the next 400 replies, about 2 s.
	cpu0, wall0 := processCPU(t, newAgent.PID), time.Now()
	testenv.Eventually(t, "400 more ping replies (2 s)", 20*time.Second, func() bool {
		return pingReplies(pinger.Output()) >= atRestart+800
	})
	cpu, wall := processCPU(t, newAgent.PID)-cpu0, time.Since(wall0)
	out := pinger.Stop()

	sent, recv := pingCounts(t, out)
	if sent < 800 || recv != sent {
		t.Errorf("ping every 5 ms across an agent restart with %d mappings: %d sent, %d received; want no loss", learned, sent, recv)
	}
	after := countMappings(t, table)
	if after < before*99/100 {
		t.Errorf("mapping table held %d before the restart and %d after: the restart flushed what was learned", before, after)
	}
	t.Logf("agent restart with %d learned mappings: %d/%d echoes answered (one every 5 ms), first reconcile %v after the restart began, table %d -> %d entries; the new agent then used %v of CPU in %v",
		learned, recv, sent, ready.Round(time.Millisecond), before, after, cpu, wall.Round(10*time.Millisecond))
}

// fillMappings writes n mappings of 10.200.0.0/16 and on to host, as
// learned and used just now.
func fillMappings(t *testing.T, m *ebpf.Map, n int, host net.HardwareAddr) {
	t.Helper()
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts) // cannot fail for this clock
	now := uint64(ts.Nano())
	var mac [6]byte
	copy(mac[:], host)
	keys := make([]uint32, 0, 8192)
	vals := make([]datapath.Mapping, 0, 8192)
	for i := 0; i < n; i++ {
		a := uint32(10<<24|200<<16) + uint32(i)
		keys = append(keys, datapath.IPKey(netip.AddrFrom4([4]byte{byte(a >> 24), byte(a >> 16), byte(a >> 8), byte(a)})))
		vals = append(vals, datapath.Mapping{HostMac: mac, ConfirmedNs: now, UsedNs: now})
		if len(keys) == cap(keys) || i == n-1 {
			if _, err := m.BatchUpdate(keys, vals, &ebpf.BatchOptions{}); err != nil {
				t.Fatalf("fill the mapping table at %d: %v", i, err)
			}
			keys, vals = keys[:0], vals[:0]
		}
	}
}

func countMappings(t *testing.T, m *ebpf.Map) int {
	t.Helper()
	n := 0
	var key uint32
	var val datapath.Mapping
	it := m.Iterate()
	for it.Next(&key, &val) {
		n++
	}
	if err := it.Err(); err != nil {
		t.Fatalf("read the mapping table: %v", err)
	}
	return n
}

// processCPU is the user+system CPU time pid has used.
func processCPU(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, _ := strings.Cut(string(b), ") ")
	f := strings.Fields(rest)
	if len(f) < 13 {
		t.Fatalf("/proc/%d/stat: %q", pid, b)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("/proc/%d/stat: utime %q stime %q", pid, f[11], f[12])
	}
	const hz = 100 // USER_HZ
	return time.Duration(ut+st) * time.Second / hz
}
