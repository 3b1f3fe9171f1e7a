package observe

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/onehop/onehop/internal/intent"
)

func TestASealedDatagramOpensOnlyWithItsKeyAndUntouched(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	d := Datagram{Sub: "s1", Node: "h1", Seq: 7, Events: []Event{{Kind: KindDrop, Farm: 2, Reason: "spoofed_ip", Src: "10.2.1.9"}}}
	b, err := Seal(key, d)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Open(key, b)
	if err != nil || got.Seq != 7 || got.Node != "h1" || len(got.Events) != 1 || got.Events[0].Reason != "spoofed_ip" {
		t.Fatalf("open: %+v, %v", got, err)
	}
	if _, err := Open([]byte("another key of thirty-two bytes."), b); !errors.Is(err, ErrUnsealed) {
		t.Errorf("opened with another key: %v", err)
	}
	b[10] ^= 1
	if _, err := Open(key, b); !errors.Is(err, ErrUnsealed) {
		t.Errorf("opened a changed datagram: %v", err)
	}
	if _, err := Open(key, []byte("short")); !errors.Is(err, ErrUnsealed) {
		t.Errorf("opened a datagram shorter than its seal: %v", err)
	}
}

func TestFilterKeepsLostCountsOfTheFarmWhateverElseItAsks(t *testing.T) {
	f := Filter{Farm: 1, Node: "h1", Reason: "not_visible", Addr: netip.MustParseAddr("10.1.1.2")}
	for _, c := range []struct {
		e    Event
		want bool
	}{
		{Event{Kind: KindDrop, Farm: 1, Node: "h1", Reason: "not_visible", Src: "10.1.1.2"}, true},
		{Event{Kind: KindDrop, Farm: 1, Node: "h1", Reason: "not_visible", Dst: "10.1.1.2"}, true},
		{Event{Kind: KindDrop, Farm: 1, Node: "h1", Reason: "spoofed_ip", Src: "10.1.1.2"}, false},
		{Event{Kind: KindDrop, Farm: 1, Node: "h1", Reason: "not_visible", Src: "10.1.1.3"}, false},
		{Event{Kind: KindDrop, Farm: 2, Node: "h1", Reason: "not_visible", Src: "10.1.1.2"}, false},
		{Event{Kind: KindDrop, Farm: 1, Node: "h2", Reason: "not_visible", Src: "10.1.1.2"}, false},
		{Event{Kind: KindLost, Farm: 1, Node: "h1", Lost: 5}, true},
		{Event{Kind: KindLost, Farm: 2, Node: "h1", Lost: 5}, false},
	} {
		if got := f.Match(c.e); got != c.want {
			t.Errorf("%+v: match %v, want %v", c.e, got, c.want)
		}
	}
}

func TestAFlowIsNamedByTheRuleThatAdmitsIt(t *testing.T) {
	farms := []intent.Farm{{Name: "blue", ID: 1, Rules: []intent.Rule{
		{ID: 1, From: "blue/web", To: "blue/db", Proto: "tcp", Port: 5432},
		{ID: 2, From: "blue/web", To: "blue/db", Proto: "udp"},
		{ID: 3, From: "blue/db", To: "blue/web", Proto: "icmp"},
	}}}
	subnets := []intent.Subnet{{Farm: "blue", Name: "web", ID: 1}, {Farm: "blue", Name: "db", ID: 2}}
	r := NewRules(farms, subnets)
	for _, c := range []struct {
		e    Event
		want uint32
	}{
		{Event{Kind: KindFlow, Src: "10.1.1.2", Dst: "10.1.2.2", Proto: "tcp", Dport: 5432}, 1},
		{Event{Kind: KindFlow, Src: "10.1.1.2", Dst: "10.1.2.2", Proto: "udp", Dport: 53}, 2},
		{Event{Kind: KindFlow, Src: "10.1.2.2", Dst: "10.1.1.2", Proto: "icmp"}, 3},
		{Event{Kind: KindFlow, Src: "10.1.1.2", Dst: "10.1.1.3", Proto: "tcp", Dport: 22}, 0}, // one subnet: no rule
		{Event{Kind: KindFlow, Src: "10.1.1.2", Dst: "10.1.2.2", Proto: "tcp", Dport: 22}, 0}, // none takes it
		{Event{Kind: KindDrop, Src: "10.1.1.2", Dst: "10.1.2.2", Proto: "udp", Dport: 53}, 0}, // drops name none
	} {
		e := c.e
		r.Admitting(&e)
		if e.Rule != c.want || (c.want != 0 && e.RuleFarm != "blue") {
			t.Errorf("%+v: rule %s#%d, want %d", c.e, e.RuleFarm, e.Rule, c.want)
		}
	}
}
