package lisp

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"
)

func TestAnswerPicksTheLongestPrefixOrTheWidestHole(t *testing.T) {
	held := []Record{
		{EID: pfx("10.1.0.0/16"), TTL: time.Hour, Locators: []Locator{{Addr: addr("192.0.2.1")}}},
		{EID: pfx("10.1.2.0/24"), TTL: time.Hour, Locators: []Locator{{Addr: addr("192.0.2.2")}}},
		{EID: pfx("2001:db8::/32"), TTL: time.Hour, Locators: []Locator{{Addr: addr("192.0.2.3")}}},
	}
	for _, tc := range []struct {
		eid  string
		want string
		neg  bool
	}{
		{"10.1.2.3", "10.1.2.0/24", false},
		{"10.1.3.3", "10.1.0.0/16", false},
		{"::ffff:10.1.3.3", "10.1.0.0/16", false},
		{"10.0.0.1", "10.0.0.0/16", true},    // 10.0/15 would hold 10.1/16
		{"192.168.1.1", "128.0.0.0/1", true}, // 0/1 holds 10.1/16; 128/1 holds nothing
		{"11.0.0.1", "11.0.0.0/8", true},     // 8.0.0.0/5 and up hold 10/8
		{"2001:db9::1", "2001:db9::/32", true},
		{"fe80::1", "8000::/1", true},
	} {
		got := Answer(held, addr(tc.eid))
		if got.EID != pfx(tc.want) || got.Negative() != tc.neg {
			t.Errorf("%s: answered %s (negative %v), want %s (negative %v)", tc.eid, got.EID, got.Negative(), tc.want, tc.neg)
		}
		if tc.neg && (got.Action != ActionNativelyForward || got.TTL != NegativeTTL) {
			t.Errorf("%s: negative answer %+v: want natively-forward, %s", tc.eid, got, NegativeTTL)
		}
	}
}

func TestParseSitesNamesTheLineAndFieldItRefuses(t *testing.T) {
	good := "# site key-id secret eids\n\ndc1 1 dc1-secret-key 10.99.0.0/16,10.98.0.0/24\ndc2 2 dc2-secret-key 2001:db8::/32\n"
	sites, err := ParseSites(strings.NewReader(good), "keys")
	if err != nil {
		t.Fatal(err)
	}
	if len(sites) != 2 || sites[0].Name != "dc1" || sites[0].KeyID != 1 || string(sites[0].Key) != "dc1-secret-key" ||
		len(sites[0].EIDs) != 2 || !sites[0].Covers(pfx("10.98.0.128/25")) || sites[0].Covers(pfx("10.98.0.0/23")) {
		t.Fatalf("parsed %+v", sites)
	}
	for _, tc := range []struct{ in, want string }{
		{"dc1 1 secret-key", "keys:1: 3 fields, want 4"},
		{"dc1 256 secret-key 10.0.0.0/8", "keys:1: key id \"256\": want 0-255"},
		{"dc1 1 short 10.0.0.0/8", "keys:1: site dc1: the secret has 5 characters, want at least 8"},
		{"dc1 1 secret-key 10.0.0.1/8", "keys:1: site dc1: EID prefix 10.0.0.1/8 has host bits set"},
		{"dc1 1 secret-key 10.0.0.0/8,x", "keys:1: site dc1: EID prefix \"x\""},
		{"dc1 1 secret-key 10.0.0.0/8\ndc1 2 secret-key 11.0.0.0/8", "keys:2: site \"dc1\" is already on line 1"},
	} {
		if _, err := ParseSites(strings.NewReader(tc.in), "keys"); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want %q", tc.in, err, tc.want)
		}
	}
}

func TestAuthorizeFindsTheSiteByKeyIDAndEIDsAndRefusesTheRest(t *testing.T) {
	sites := []Site{
		{Name: "a", KeyID: 1, Key: []byte("site-a-secret"), EIDs: []netip.Prefix{pfx("10.1.0.0/16")}},
		{Name: "b", KeyID: 1, Key: []byte("site-b-secret"), EIDs: []netip.Prefix{pfx("10.2.0.0/16")}},
	}
	seal := func(key string, eids ...string) []byte {
		m := MapRegister{Nonce: 1}
		for _, e := range eids {
			m.Records = append(m.Records, Record{EID: pfx(e), TTL: time.Hour, Locators: []Locator{{Addr: addr("192.0.2.1")}}})
		}
		b, err := m.Seal(1, []byte(key))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	if _, s, err := Authorize(seal("site-b-secret", "10.2.1.0/24"), sites); err != nil || s.Name != "b" {
		t.Fatalf("site b: %v, %v", s, err)
	}
	if _, _, err := Authorize(seal("site-a-secret", "10.2.1.0/24"), sites); !errors.Is(err, ErrBadAuth) {
		t.Fatalf("site a's key for site b's EIDs: %v, want ErrBadAuth", err)
	}
	if _, _, err := Authorize(seal("site-a-secret", "10.1.0.0/16", "10.2.0.0/16"), sites); !errors.Is(err, ErrNoSite) {
		t.Fatalf("EIDs of two sites: %v, want ErrNoSite", err)
	}
	plain, _ := (&MapRegister{Nonce: 1, Records: []Record{{EID: pfx("10.1.0.0/16")}}}).Encode()
	if _, _, err := Authorize(plain, sites); !errors.Is(err, ErrNoAuth) {
		t.Fatalf("unauthenticated: %v, want ErrNoAuth", err)
	}
	var de *Error
	if _, _, err := Authorize([]byte{0x30}, sites); !errors.As(err, &de) {
		t.Fatalf("garbage: %v, want a decoding error", err)
	}
}
