package lease

import (
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/intent"
)

func TestFreeSliceSkipsLeasesSlicesAndTheEphemeralRange(t *testing.T) {
	l := func(lo, hi uint16) intent.Lease { return intent.Lease{Lo: lo, Hi: hi} }
	cases := []struct {
		name  string
		size  uint16
		taken []intent.Lease
		want  intent.Lease
		err   string
	}{
		{name: "an empty address starts at the floor", size: 256, want: l(1024, 1279)},
		{name: "past a sliver's lease at the floor", size: 256, taken: []intent.Lease{l(1000, 1100)}, want: l(1101, 1356)},
		{name: "into a gap that fits exactly", size: 100, taken: []intent.Lease{l(1024, 1099), l(1200, 1300)}, want: l(1100, 1199)},
		{name: "not into a gap too small", size: 101, taken: []intent.Lease{l(1024, 1099), l(1200, 1300)}, want: l(1301, 1401)},
		{name: "another uplink's lease is no obstacle", size: 10, taken: []intent.Lease{{Uplink: 1, Lo: 1024, Hi: 2000}}, want: l(1024, 1033)},
		{name: "past the ephemeral range", size: 1000, taken: []intent.Lease{l(1024, 32000)}, want: l(61000, 61999)},
		{name: "full", size: 5000, taken: []intent.Lease{l(1024, 32767)}, err: "no 5000 free ports on uplink 0"},
	}
	for _, c := range cases {
		got, err := FreeSlice(0, c.size, c.taken, DefaultEphemeralLo, DefaultEphemeralHi)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: err %v, want %q", c.name, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("%s: got %+v, %v; want %+v", c.name, got, err, c.want)
		}
	}
}
