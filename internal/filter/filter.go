// Package filter reads the protocol and port filters that visibility rules,
// firewall rules and TAP policies share, and names the field a check
// rejected. It is a leaf (policy imports tappolicy, so neither can hold
// what both need).
package filter

import (
	"fmt"
	"strconv"
	"strings"
)

// FieldError says which input a check rejected: Field is its name (a JSON
// field such as portLo, a CLI flag's or topology key's name such as
// sport), so the API can name it and the CLI can map it to its flag; Msg
// says what is wrong with the value.
type FieldError struct {
	Field string
	Msg   string
}

func (e *FieldError) Error() string { return e.Msg }

// Errorf is a *FieldError for field, its message formatted.
func Errorf(field, format string, a ...any) error {
	return &FieldError{Field: field, Msg: fmt.Sprintf(format, a...)}
}

// ProtoNumber maps a protocol name (any case) to its IP protocol number; ""
// and "any" are 0, the wildcard.
func ProtoNumber(name string) (uint8, error) {
	switch strings.ToLower(name) {
	case "", "any":
		return 0, nil
	case "icmp":
		return 1, nil
	case "tcp":
		return 6, nil
	case "udp":
		return 17, nil
	}
	return 0, fmt.Errorf("protocol %q is not tcp, udp, icmp or any", name)
}

// ParsePorts reads a port N or a range N-M (1 <= N <= M <= 65535); "" is
// any port (0, 0). A single port comes back as the range N..N.
func ParsePorts(s string) (lo, hi uint16, err error) {
	if s == "" {
		return 0, 0, nil
	}
	a, b, isRange := strings.Cut(s, "-")
	l, err1 := strconv.ParseUint(a, 10, 16)
	h := l
	var err2 error
	if isRange {
		h, err2 = strconv.ParseUint(b, 10, 16)
	}
	switch {
	case err1 != nil || err2 != nil:
		return 0, 0, fmt.Errorf("ports %q: want a port N or a range N-M, 1 <= N <= M <= 65535", s)
	case l == 0:
		return 0, 0, fmt.Errorf("ports %q: port 0 is not a port; leave the filter out to match any port", s)
	case l > h:
		return 0, 0, fmt.Errorf("ports %q: the range ends below its start; want N-M with N <= M", s)
	}
	return uint16(l), uint16(h), nil
}
