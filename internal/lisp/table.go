package lisp

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// NegativeTTL is the TTL of a negative Map-Reply for an EID no mapping
// covers (RFC 9301 §8.1 recommends 15 minutes).
const NegativeTTL = 15 * time.Minute

// RegistrationTimeout is how long a map-server keeps a registered record
// that is not refreshed when the Map-Register did not set T (RFC 9301
// §8.2: three times the 60-second registration interval).
const RegistrationTimeout = 3 * DefaultRegisterInterval

// Answer is the record a map-server returns for eid from the mappings it
// holds: the longest EID prefix covering eid, or, when none does, a
// negative record (no locators, Natively-Forward, NegativeTTL) for the
// shortest prefix around eid that overlaps none of the held prefixes, so
// that the asker caches one answer for the whole hole.
func Answer(held []Record, eid netip.Addr) Record {
	eid = eid.Unmap()
	best := -1
	for i, r := range held {
		if r.EID.Contains(eid) && (best < 0 || r.EID.Bits() > held[best].EID.Bits()) {
			best = i
		}
	}
	if best >= 0 {
		return held[best].Clone()
	}
	return Record{EID: negativePrefix(held, eid), TTL: NegativeTTL, Action: ActionNativelyForward, Authoritative: true}
}

func negativePrefix(held []Record, eid netip.Addr) netip.Prefix {
	for bits := 0; bits <= eid.BitLen(); bits++ {
		p, _ := eid.Prefix(bits)
		free := true
		for _, r := range held {
			if r.EID.Addr().BitLen() == eid.BitLen() && p.Overlaps(r.EID) {
				free = false
				break
			}
		}
		if free {
			return p
		}
	}
	return netip.PrefixFrom(eid, eid.BitLen()) // unreachable: no held prefix contains eid
}

// Site is one LISP site a map-server accepts registrations from: a name,
// the key id and shared secret its Map-Registers are authenticated with,
// and the EID prefixes it may register (a record must lie within one).
type Site struct {
	Name  string
	KeyID uint8
	Key   []byte
	EIDs  []netip.Prefix
}

// Covers reports whether the site may register p.
func (s Site) Covers(p netip.Prefix) bool {
	for _, e := range s.EIDs {
		if e.Bits() <= p.Bits() && e.Contains(p.Addr()) {
			return true
		}
	}
	return false
}

// ParseSites reads a site-keys file: one site a line,
//
//	NAME KEY-ID SECRET EID-PREFIX[,EID-PREFIX...]
//
// e.g. "dc1 1 s3cret-shared-key 10.99.0.0/16,10.98.0.0/24"; blank lines and
// lines starting with # are skipped. The secret is used as its bytes.
func ParseSites(r io.Reader, file string) ([]Site, error) {
	var out []Site
	names := map[string]int{}
	sc := bufio.NewScanner(r)
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		f := strings.Fields(text)
		if len(f) != 4 {
			return nil, fmt.Errorf("%s:%d: %d fields, want 4: NAME KEY-ID SECRET EID-PREFIX[,EID-PREFIX...]", file, line, len(f))
		}
		if prev, ok := names[f[0]]; ok {
			return nil, fmt.Errorf("%s:%d: site %q is already on line %d", file, line, f[0], prev)
		}
		names[f[0]] = line
		id, err := strconv.ParseUint(f[1], 10, 8)
		if err != nil {
			return nil, fmt.Errorf("%s:%d: key id %q: want 0-255", file, line, f[1])
		}
		if len(f[2]) < 8 {
			return nil, fmt.Errorf("%s:%d: site %s: the secret has %d characters, want at least 8", file, line, f[0], len(f[2]))
		}
		s := Site{Name: f[0], KeyID: uint8(id), Key: []byte(f[2])}
		for _, ps := range strings.Split(f[3], ",") {
			p, err := netip.ParsePrefix(ps)
			if err != nil {
				return nil, fmt.Errorf("%s:%d: site %s: EID prefix %q: %v", file, line, f[0], ps, err)
			}
			if p.Masked() != p {
				return nil, fmt.Errorf("%s:%d: site %s: EID prefix %s has host bits set (want %s)", file, line, f[0], p, p.Masked())
			}
			s.EIDs = append(s.EIDs, p)
		}
		out = append(out, s)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return out, nil
}

// ErrNoSite: no configured site has the Map-Register's key id and covers
// all of its records.
var ErrNoSite = errors.New("lisp: no site with this key id may register these EID prefixes")

// Authorize decodes the Map-Register b and finds the site that sent it: one
// whose key id matches, whose prefixes cover every record and whose secret
// authenticates the message. Errors: a decoding *Error, ErrNoAuth,
// ErrUnsupportedAlgorithm, ErrNoSite, ErrBadAuth.
func Authorize(b []byte, sites []Site) (MapRegister, *Site, error) {
	m, err := DecodeMapRegister(b)
	if err != nil {
		return MapRegister{}, nil, err
	}
	if m.AlgorithmID == AlgNone && len(m.AuthData) == 0 {
		return m, nil, ErrNoAuth
	}
	if m.AlgorithmID != AlgHMACSHA256_128 {
		return m, nil, fmt.Errorf("%w: algorithm %d", ErrUnsupportedAlgorithm, m.AlgorithmID)
	}
	tried := false
	for i := range sites {
		s := &sites[i]
		if s.KeyID != m.KeyID || !coversAll(*s, m.Records) {
			continue
		}
		tried = true
		if err := Authenticate(b, s.Key); err == nil {
			return m, s, nil
		}
	}
	if !tried {
		return m, nil, fmt.Errorf("%w (key id %d, %s)", ErrNoSite, m.KeyID, eidList(m.Records))
	}
	return m, nil, ErrBadAuth
}

func coversAll(s Site, recs []Record) bool {
	for _, r := range recs {
		if !s.Covers(r.EID) {
			return false
		}
	}
	return true
}

func eidList(recs []Record) string {
	parts := make([]string, len(recs))
	for i, r := range recs {
		parts[i] = r.EID.String()
	}
	return strings.Join(parts, ",")
}
