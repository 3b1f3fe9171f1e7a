package egressspec

import (
	"reflect"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/intent"
)

func TestFarmSettingIsCheckedWithErrorsNamingWhatIsWrong(t *testing.T) {
	cases := []struct {
		in   Setting
		want *intent.FarmEgress
		err  string
	}{
		{in: Setting{}, want: nil},
		{in: Setting{Enabled: true}, want: &intent.FarmEgress{To: []string{"0.0.0.0/0"}, Slice: DefaultSlice}},
		{in: Setting{Enabled: true, To: []string{" 192.0.2.0/24", "198.51.100.0/24"}, Slice: 16},
			want: &intent.FarmEgress{To: []string{"192.0.2.0/24", "198.51.100.0/24"}, Slice: 16}},
		{in: Setting{Enabled: true, Slice: 4097}, err: "slice of 4097 ports: want 16..4096"},
		{in: Setting{Enabled: true, To: []string{"192.0.2.1/24"}}, err: "did you mean 192.0.2.0/24?"},
		{in: Setting{Enabled: true, To: []string{"nowhere"}}, err: `destination 1 "nowhere": want an IPv4 prefix`},
		{in: Setting{Enabled: true, To: make([]string, MaxTo+1)}, err: "at most 16 prefixes"},
		{in: Setting{To: []string{"0.0.0.0/0"}}, err: "pass --egress to turn it on"},
	}
	for _, c := range cases {
		got, err := Farm(c.in)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%+v: err %v, want %q", c.in, err, c.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("%+v: got %+v, %v; want %+v", c.in, got, err, c.want)
		}
	}
}
