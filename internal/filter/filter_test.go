package filter

import (
	"errors"
	"strings"
	"testing"
)

func TestParsePortsReadsPortsAndRangesAndSaysWhatIsWrong(t *testing.T) {
	for _, c := range []struct {
		in     string
		lo, hi uint16
		err    string
	}{
		{"", 0, 0, ""},
		{"22", 22, 22, ""},
		{"8000-8080", 8000, 8080, ""},
		{"1-65535", 1, 65535, ""},
		{"0", 0, 0, "port 0 is not a port"},
		{"0-10", 0, 0, "port 0 is not a port"},
		{"90-80", 0, 0, "the range ends below its start"},
		{"65536", 0, 0, "want a port N or a range N-M"},
		{"80-", 0, 0, "want a port N or a range N-M"},
		{"http", 0, 0, "want a port N or a range N-M"},
	} {
		lo, hi, err := ParsePorts(c.in)
		switch {
		case c.err == "" && (err != nil || lo != c.lo || hi != c.hi):
			t.Errorf("ParsePorts(%q) = %d, %d, %v; want %d, %d", c.in, lo, hi, err, c.lo, c.hi)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err) || !strings.Contains(err.Error(), `"`+c.in+`"`)):
			t.Errorf("ParsePorts(%q): %v; want an error naming the value with %q", c.in, err, c.err)
		}
	}
}

func TestProtoNumberKnowsTheNamedProtocolsInAnyCase(t *testing.T) {
	for name, want := range map[string]uint8{"": 0, "any": 0, "ANY": 0, "icmp": 1, "TCP": 6, "udp": 17} {
		if got, err := ProtoNumber(name); err != nil || got != want {
			t.Errorf("ProtoNumber(%q) = %d, %v; want %d", name, got, err, want)
		}
	}
	if _, err := ProtoNumber("sctp"); err == nil || !strings.Contains(err.Error(), `"sctp"`) {
		t.Errorf("ProtoNumber(sctp): %v; want an error naming it", err)
	}
}

func TestAFieldErrorIsItsMessageAndKeepsItsField(t *testing.T) {
	err := Errorf("sport", "ports %q: bad", "x")
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Field != "sport" || err.Error() != `ports "x": bad` {
		t.Fatalf("%#v", err)
	}
}
