package gateway

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/testenv"
	"github.com/vishvananda/netlink/nl"
)

// subflowEventAttrs encodes a subflow event's attributes as the kernel
// does (mptcp_event_put_token_and_ssk): token in host order, addresses and
// ports in network order, the error a byte, the reset reason a u32.
func subflowEventAttrs(token uint32, local, remote netip.AddrPort, errno uint8, reset *uint32) []byte {
	var out []byte
	add := func(typ int, v []byte) { out = append(out, nl.NewRtAttr(typ, v).Serialize()...) }
	tok := make([]byte, 4)
	binary.NativeEndian.PutUint32(tok, token)
	add(mptcpAttrToken, tok)
	add(2, nl.Uint16Attr(syscall.AF_INET)) // family
	l4, r4 := local.Addr().As4(), remote.Addr().As4()
	add(mptcpAttrSaddr4, l4[:])
	add(mptcpAttrDaddr4, r4[:])
	add(mptcpAttrSport, binary.BigEndian.AppendUint16(nil, local.Port()))
	add(mptcpAttrDport, binary.BigEndian.AppendUint16(nil, remote.Port()))
	if errno != 0 {
		add(mptcpAttrError, []byte{errno})
	}
	if reset != nil {
		r := make([]byte, 4)
		binary.NativeEndian.PutUint32(r, *reset)
		add(mptcpAttrResetReason, r)
	}
	return out
}

func TestParseSubflowEventReadsTheKernelsAttributes(t *testing.T) {
	local, remote := netip.MustParseAddrPort("10.77.0.2:40001"), netip.MustParseAddrPort("10.88.0.10:8080")
	ev, ok, err := parseSubflowEvent(mptcpEventSubClosed, subflowEventAttrs(0xb334d37f, local, remote, uint8(syscall.ECONNREFUSED), nil))
	if err != nil || !ok {
		t.Fatalf("closed event: ok %v, err %v", ok, err)
	}
	want := SubflowEvent{Token: 0xb334d37f, Local: local, Remote: remote, Err: syscall.ECONNREFUSED}
	if ev != want {
		t.Fatalf("closed event %+v, want %+v", ev, want)
	}
	prohibit := uint32(3)
	ev, ok, _ = parseSubflowEvent(mptcpEventSubEstablished, subflowEventAttrs(7, local, remote, 0, &prohibit))
	if !ok || !ev.Established || !ev.Reset || ev.ResetReason != 3 || ev.Err != 0 {
		t.Fatalf("established event with a reset reason: %+v", ev)
	}
	if _, ok, _ := parseSubflowEvent(1 /* MPTCP_EVENT_CREATED */, subflowEventAttrs(7, local, remote, 0, nil)); ok {
		t.Fatal("a connection's event was taken for a subflow's")
	}
	/* an attribute whose length runs past the message */
	if _, ok, _ := parseSubflowEvent(mptcpEventSubClosed, []byte{40, 0, 1, 0, 7, 0, 0, 0}); ok {
		t.Fatal("a truncated event was taken for a subflow's")
	}
}

// Each way a join ends, as status says it.
func TestClosedWhyNamesHowAJoinEnded(t *testing.T) {
	dest := netip.MustParseAddrPort("10.88.0.10:8080")
	sent, up := &join{state: joinSent}, &join{state: joinUp}
	prohibit := uint32(3)
	for _, tc := range []struct {
		ev   SubflowEvent
		j    *join
		want string
	}{
		{SubflowEvent{Err: syscall.ECONNREFUSED}, sent, "plain reset, nothing listens on 10.88.0.10:8080"},
		{SubflowEvent{Err: syscall.ETIMEDOUT}, sent, "join sent, no answer"},
		{SubflowEvent{Reset: true, ResetReason: prohibit}, sent, "refused by the server: MP_TCPRST, administratively prohibited"},
		{SubflowEvent{Reset: true, ResetReason: 99}, up, "closed by the server: MP_TCPRST, reason 99"},
		{SubflowEvent{}, up, "as soon as it joined"},
		{SubflowEvent{}, sent, "closed before it was established"},
	} {
		if got := closedWhy(tc.ev, tc.j, dest, tc.j.since); !strings.Contains(got, tc.want) {
			t.Errorf("closedWhy(%+v, state %d) = %q, want it to say %q", tc.ev, tc.j.state, got, tc.want)
		}
	}
}

// A join refused shows in status as a planned path missing, with why. When
// the connection's one established path dies, its subflow is kept (not
// destroyed) while the live path is joined again at once; once that join
// is up, the dead path's subflow goes.
func TestALastSubflowIsKeptUntilALivePathJoins(t *testing.T) {
	cfg := validConfig()
	pm := &fakePM{}
	wan1 := SubflowInfo{Local: netip.MustParseAddrPort("10.77.0.1:4000"), Remote: netip.MustParseAddrPort("10.88.0.10:80"), BytesReceived: 100, State: 1}
	wan2 := SubflowInfo{Local: netip.MustParseAddrPort("10.77.0.2:4001"), Remote: netip.MustParseAddrPort("10.88.0.10:80"), State: 1}
	ls := &liveSubflows{sfs: []SubflowInfo{wan1}}
	e := NewEngine(&cfg, EngineDeps{Find: pathOf, Pin: &fakePin{}, PM: pm, Subflows: ls.read})
	rec := Record{EID: netip.MustParsePrefix("10.88.0.0/24"), Locators: []Locator{loc("192.0.1.2", 1, 1), loc("192.0.2.2", 1, 1)}}
	c := &conn{dest: netip.MustParseAddrPort("10.88.0.10:80"), mode: ModeMPTCP, rec: rec, token: 7}
	c.plan = PlanFor(rec, nil, pathOf).Subflows
	c.setJoin(0, joinUp, "")
	e.register(c)
	e.addSubflow(c, 1)
	e.SubflowEvent(SubflowEvent{Token: 7, Local: netip.MustParseAddrPort("10.77.0.2:3999"), Remote: c.dest, Err: syscall.ECONNREFUSED})
	_, conns := e.Status()
	if s := conns[0]; s.PlannedPaths != 2 || s.EstablishedPaths != 1 || len(s.Missing) != 1 || s.Missing[0].Path != "wan2" || !strings.Contains(s.Missing[0].Reason, "plain reset") {
		t.Fatalf("status after a refused join: %+v", s)
	}
	/* another connection's event, or one for an unknown path, changes nothing */
	e.SubflowEvent(SubflowEvent{Token: 8, Local: wan1.Local, Remote: c.dest})
	e.SubflowEvent(SubflowEvent{Token: 7, Local: netip.MustParseAddrPort("10.9.9.9:1"), Remote: c.dest})

	e.SetPathUp(0, false)
	pm.mu.Lock()
	destroyed := append([]string(nil), pm.destroyed...)
	pm.mu.Unlock()
	if len(destroyed) != 0 {
		t.Fatalf("wan1 down: destroyed %v, want the connection's last subflow kept", destroyed)
	}
	pm.waitCreated(t, "wan1 down: wan2 joined again", []string{"10.77.0.2", "10.77.0.2"})
	_, conns = e.Status()
	if s := conns[0]; !strings.HasPrefix(s.Subflows[0].State, "kept: last subflow") || s.EstablishedPaths != 0 || !strings.Contains(missing(s, "wan1"), "kept") {
		t.Fatalf("status with wan1 down: %+v", s)
	}
	if got := e.Counters()["last_subflow_kept"]; got != 1 {
		t.Fatalf("last_subflow_kept = %d", got)
	}

	ls.mu.Lock()
	ls.sfs = []SubflowInfo{wan1, wan2}
	ls.mu.Unlock()
	e.SubflowEvent(SubflowEvent{Token: 7, Local: wan2.Local, Remote: c.dest, Established: true})
	pm.mu.Lock()
	destroyed = append([]string(nil), pm.destroyed...)
	pm.mu.Unlock()
	if len(destroyed) != 1 || destroyed[0] != "10.77.0.1:4000" {
		t.Fatalf("wan2 joined: destroyed %v, want wan1's kept subflow", destroyed)
	}
	/* the close event of the subflow the gateway closed says nothing */
	e.SubflowEvent(SubflowEvent{Token: 7, Local: wan1.Local, Remote: c.dest})
	ls.set(func(sfs []SubflowInfo) { sfs[0].State = 7 })
	_, conns = e.Status()
	if s := conns[0]; s.Subflows[0].State != "closed: path down" || s.EstablishedPaths != 1 || missing(s, "wan1") != "path down" {
		t.Fatalf("status after wan2 joined: %+v", s)
	}
	if got := e.Counters(); got["subflows_closed_path_down"] != 1 || got["subflows_joined"] != 1 || got["subflows_failed"] != 1 {
		t.Fatalf("counters %v", got)
	}
}

// waitCreated waits until f created exactly the subflows want (by local
// address, in order).
func (f *fakePM) waitCreated(t *testing.T, when string, want []string) {
	t.Helper()
	testenv.Eventually(t, when, 5*time.Second, func() error {
		f.mu.Lock()
		defer f.mu.Unlock()
		if !slices.Equal(f.created, want) {
			return fmt.Errorf("created %v, want %v", f.created, want)
		}
		return nil
	})
}
