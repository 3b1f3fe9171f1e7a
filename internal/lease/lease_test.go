package lease

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/intent"
)

// lease is a lease, short for the tables.
func lease(uplink int, lo, hi uint16) intent.Lease {
	return intent.Lease{Uplink: uplink, Lo: lo, Hi: hi}
}

func TestParseLeasesReadsRangesPortsAndUplinks(t *testing.T) {
	cases := []struct {
		in   string
		want []intent.Lease
		text string // Format of the result
	}{
		{"10000-10099", []intent.Lease{lease(0, 10000, 10099)}, "10000-10099"},
		{"10022", []intent.Lease{lease(0, 10022, 10022)}, "10022"},
		{"1-1", []intent.Lease{lease(0, 1, 1)}, "1"},
		{"65535", []intent.Lease{lease(0, 65535, 65535)}, "65535"},
		{"10000-10099,1:20000-20099", []intent.Lease{lease(0, 10000, 10099), lease(1, 20000, 20099)}, "10000-10099,1:20000-20099"},
		{"0:10000-10099", []intent.Lease{lease(0, 10000, 10099)}, "10000-10099"},
		{" 3:5-6 , 2000-2001 ", []intent.Lease{lease(0, 2000, 2001), lease(3, 5, 6)}, "2000-2001,3:5-6"},
		// The same ports on two uplinks are two addresses: no overlap.
		{"1:10000-10099,10000-10099", []intent.Lease{lease(0, 10000, 10099), lease(1, 10000, 10099)}, "10000-10099,1:10000-10099"},
		// Adjacent ranges touch but do not overlap.
		{"10100-10199,10000-10099", []intent.Lease{lease(0, 10000, 10099), lease(0, 10100, 10199)}, "10000-10099,10100-10199"},
	}
	for _, c := range cases {
		t.Run(c.in, func(t *testing.T) {
			got, err := Parse(c.in)
			if err != nil {
				t.Fatalf("Parse(%q): %v", c.in, err)
			}
			if !reflect.DeepEqual(got, c.want) {
				t.Fatalf("Parse(%q) = %+v, want %+v", c.in, got, c.want)
			}
			if s := Format(got); s != c.text {
				t.Fatalf("Format = %q, want %q", s, c.text)
			}
		})
	}
}

func TestParseLeasesRefusesBadListsSayingWhy(t *testing.T) {
	cases := []struct{ in, want string }{
		{"", "empty lease list"},
		{"  ", "empty lease list"},
		{"0-10", `port "0": want a number 1..65535`},
		{"10-65536", `port "65536": want a number 1..65535`},
		{"200-100", "range 200-100 runs backwards"},
		{"4:10-20", `uplink "4": want a number 0..3`},
		{"-1:10-20", `uplink "-1"`},
		{"x:10-20", `uplink "x"`},
		{"10-", `port ""`},
		{"-10", `port ""`},
		{"10-20-30", `port "20-30"`},
		{"abc", `port "abc"`},
		{"10000-10099,", `lease 2 "": empty range`},
		{"10000-10099,,1", `lease 2 "": empty range`},
		{"10000-10099,10050-10149", "leases 10000-10099 and 10050-10149 overlap on ports 10050-10099"},
		{"1:5,1:1-10", "leases 1:1-10 and 1:5 overlap on ports 5"},
		{"1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17", "17 leases: a sliver may hold at most 16"},
	}
	for _, c := range cases {
		t.Run(c.in, func(t *testing.T) {
			got, err := Parse(c.in)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Parse(%q) = %+v, %v; want an error containing %q", c.in, got, err, c.want)
			}
		})
	}
}

func TestCheckLeasesRefusesWhatParseCannotProduce(t *testing.T) {
	cases := []struct {
		ls   []intent.Lease
		want string
	}{
		{nil, "no leases"},
		{[]intent.Lease{lease(0, 0, 10)}, "want 1 <= LO <= HI"},
		{[]intent.Lease{lease(0, 20, 10)}, "want 1 <= LO <= HI"},
		{[]intent.Lease{lease(-1, 1, 10)}, "uplink -1"},
		{[]intent.Lease{lease(MaxUplinks, 1, 10)}, "uplink 4"},
	}
	for _, c := range cases {
		if err := Check(c.ls); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Check(%+v) = %v, want %q", c.ls, err, c.want)
		}
	}
}

func TestOverlapNamesTheOtherHolderOrTheHostsEphemeralRange(t *testing.T) {
	others := []intent.Sliver{
		{Host: "h1", Name: "s2", Slot: 2, Leases: []intent.Lease{lease(0, 10100, 10199)}},
		{Host: "h1", Name: "s1", Slot: 1, Leases: []intent.Lease{lease(0, 10000, 10099), lease(1, 20000, 20099)}},
		{Host: "h2", Name: "s9", Slot: 1, Leases: []intent.Lease{lease(0, 12000, 12099)}}, // another host: its ports are its own
	}
	cases := []struct {
		name   string
		leases string
		ephLo  uint16
		ephHi  uint16
		want   string // "" no overlap
		holder string
	}{
		{"free range", "10200-10299", 32768, 60999, "", ""},
		{"touching edges", "9900-9999,10200-10299", 32768, 60999, "", ""},
		{"other host's range is free here", "12000-12099", 32768, 60999, "", ""},
		{"same ports, other uplink", "1:10000-10099,20000-20099", 32768, 60999, "", ""},
		{"overlaps s1", "10050-10149", 32768, 60999, "ports 10050-10099 on uplink 0 overlap h1/s1's lease 10000-10099", "h1/s1"},
		{"one port of s2", "10199", 32768, 60999, "ports 10199 on uplink 0 overlap h1/s2's lease 10100-10199", "h1/s2"},
		{"s1 on uplink 1", "1:20099-20100", 32768, 60999, "ports 20099 on uplink 1 overlap h1/s1's lease 20000-20099", "h1/s1"},
		{"ephemeral default", "32000-32768", 32768, 60999, "ports 32768 on uplink 0 overlap host h1's ephemeral range 32768-60999", ""},
		{"ephemeral on uplink 1 too", "1:60999-61000", 32768, 60999, "ports 60999 on uplink 1 overlap host h1's ephemeral range 32768-60999", ""},
		{"narrow ephemeral range", "40000-40010", 50000, 50100, "", ""},
		{"narrow ephemeral hit", "50100-50200", 50000, 50100, "ports 50100 on uplink 0 overlap host h1's ephemeral range 50000-50100", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ls, err := Parse(c.leases)
			if err != nil {
				t.Fatal(err)
			}
			err = Overlap("h1", "s3", ls, others, c.ephLo, c.ephHi)
			if c.want == "" {
				if err != nil {
					t.Fatalf("Overlap: %v, want none", err)
				}
				return
			}
			var oe *OverlapError
			if !errors.As(err, &oe) || !strings.HasPrefix(err.Error(), c.want) {
				t.Fatalf("Overlap: %v, want %q", err, c.want)
			}
			if oe.Holder != c.holder {
				t.Fatalf("holder %q, want %q", oe.Holder, c.holder)
			}
		})
	}
}

func TestOverlapSkipsTheSliverBeingReplaced(t *testing.T) {
	others := []intent.Sliver{{Host: "h1", Name: "s1", Slot: 1, Leases: []intent.Lease{lease(0, 10000, 10099)}}}
	ls := []intent.Lease{lease(0, 10000, 10199)}
	if err := Overlap("h1", "s1", ls, others, DefaultEphemeralLo, DefaultEphemeralHi); err != nil {
		t.Fatalf("s1 growing its own lease: %v", err)
	}
	if err := Overlap("h1", "s2", ls, others, DefaultEphemeralLo, DefaultEphemeralHi); err == nil {
		t.Fatal("s2 taking s1's ports: no overlap reported")
	}
}

func TestEphemeralDefaultsToLinuxsRangeWhenUnreported(t *testing.T) {
	if lo, hi := Ephemeral(intent.Node{}); lo != 32768 || hi != 60999 {
		t.Fatalf("unreported: %d-%d, want 32768-60999", lo, hi)
	}
	if lo, hi := Ephemeral(intent.Node{EphemeralLo: 40000, EphemeralHi: 45000}); lo != 40000 || hi != 45000 {
		t.Fatalf("reported: %d-%d, want 40000-45000", lo, hi)
	}
}

func TestSliverNamesFollowTheHostRule(t *testing.T) {
	for _, ok := range []string{"s1", "a", "abcdefghijkl", "web9"} {
		if err := CheckSliverName(ok); err != nil {
			t.Errorf("CheckSliverName(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"", "1s", "S1", "s-1", "abcdefghijklm", "s_1", "s/1"} {
		if err := CheckSliverName(bad); err == nil || !strings.Contains(err.Error(), "1-12 lowercase") {
			t.Errorf("CheckSliverName(%q) = %v, want a refusal", bad, err)
		}
	}
	if n := len(intent.SliverIfname("abcdefghijkl", MaxUplinks-1)); n > 15 {
		t.Fatalf("longest sliver ifname is %d bytes, Linux takes 15", n)
	}
}

// FuzzParseLeases: whatever a user types, Parse either refuses it
// or returns leases that pass Check and read back the same from
// their formatted form.
func FuzzParseLeases(f *testing.F) {
	for _, s := range []string{"10000-10099", "10022", "10000-10099,1:20000-20099", "3:1-65535", "0-1", "1,1", "1:2:3", " 5 - 6 ", "65535-65535,0:1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ls, err := Parse(s)
		if err != nil {
			if err.Error() == "" {
				t.Fatalf("%q: empty error", s)
			}
			return
		}
		if err := Check(ls); err != nil {
			t.Fatalf("%q parsed to %+v, which Check refuses: %v", s, ls, err)
		}
		text := Format(ls)
		again, err := Parse(text)
		if err != nil {
			t.Fatalf("%q -> %q does not parse again: %v", s, text, err)
		}
		if !reflect.DeepEqual(again, ls) {
			t.Fatalf("%q -> %q -> %+v, want %+v", s, text, again, ls)
		}
		if err := Overlap("h", "x", ls, []intent.Sliver{{Host: "h", Name: "x", Leases: ls}}, 1, 0); err != nil {
			t.Fatalf("%q: overlaps itself: %v", s, err)
		}
	})
}
