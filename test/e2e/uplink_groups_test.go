package e2e

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/testenv"
)

// scopeGroups lists the scope groups (03:00:0a:*:*:00) node's uplink is
// joined to, as `ip maddr show` prints them.
func (l *testLab) scopeGroups(node string) []string {
	l.t.Helper()
	var out []string
	for _, line := range strings.Split(l.mustIn(node, "ip", "maddr", "show", "dev", "uplink0"), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "link" && strings.HasPrefix(f[1], "03:00:0a:") {
			out = append(out, f[1])
		}
	}
	slices.Sort(out)
	return out
}

// groupsOf is the subnet's and the farm's group of each VM, sorted.
func (l *testLab) groupsOf(vms ...string) []string {
	var out []string
	for _, vm := range vms {
		b := netip.MustParseAddr(l.ip(vm)).As4()
		for _, g := range []string{fmt.Sprintf("03:00:0a:%02x:%02x:00", b[1], b[2]), fmt.Sprintf("03:00:0a:%02x:00:00", b[1])} {
			if !slices.Contains(out, g) {
				out = append(out, g)
			}
		}
	}
	slices.Sort(out)
	return out
}

func TestPrivilegedUplinksJoinTheGroupsOfTheirVMsScopesAndLeaveThemWithTheLastVM(t *testing.T) {
	l := upLab(t, scopes)
	want := map[string][]string{"h1": l.groupsOf("web1", "web3", "db2", "red2"), "h2": l.groupsOf("web2", "db1", "red1")}
	for host, groups := range want {
		testenv.Eventually(t, host+"'s uplink joined to its VMs' scope groups", 10*time.Second, func() error {
			if got := l.scopeGroups(host); !slices.Equal(got, groups) {
				return fmt.Errorf("%v, want %v", got, groups)
			}
			return nil
		})
	}
	// red1 is h2's only VM of the red farm: its groups go with it; h1
	// keeps them for red2.
	gone := l.groupsOf("red1")
	if out, err := l.cli("vm", "delete", "red/web/red1"); err != nil {
		t.Fatalf("vm delete: %v\n%s", err, out)
	}
	testenv.Eventually(t, "h2's uplink to leave red's groups", 10*time.Second, func() error {
		if got := l.scopeGroups("h2"); !slices.Equal(got, l.groupsOf("web2", "db1")) {
			return fmt.Errorf("%v, want %v", got, l.groupsOf("web2", "db1"))
		}
		return nil
	})
	if got := l.scopeGroups("h1"); !slices.Equal(got, want["h1"]) || !slices.Contains(got, gone[0]) {
		t.Fatalf("h1's groups changed when h2's VM went: %v, want %v", got, want["h1"])
	}
}
