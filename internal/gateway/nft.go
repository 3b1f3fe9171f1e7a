package gateway

import (
	"encoding/json"
	"fmt"
	"strings"
)

// NFTTable is the nftables table the gateway owns (family ip). It never
// touches another table, and deletes its own on exit.
const NFTTable = "onehop_gateway"

// NFTRules is the nftables script that intercepts: TCP arriving on an
// intercept interface for an address that is not the gateway's own is
// handed to the TPROXY listener (tproxy finds the established socket of a
// known flow first, then the listener) and marked so that policy routing
// delivers it locally. The listener is bound to 127.0.0.1, which no
// packet from outside can be addressed to: a user who connects to the
// gateway's own address and listen port reaches nothing (a listener on
// 0.0.0.0 would take that connection and proxy it to itself, again and
// again). The script replaces the table whole, so applying it twice is
// harmless.
//
// Before that, anything a user sends to an infrastructure address
// (InfrastructurePrefixes), in any protocol, is dropped and counted in the
// table's counter NFTInfraCounter: TPROXY would otherwise open it natively
// from the gateway's own address, which the controller and the map-server
// see as the gateway, and the kernel would forward the rest.
func NFTRules(c *Config) string {
	ifs := make([]string, len(c.Intercept))
	for i, n := range c.Intercept {
		ifs[i] = fmt.Sprintf("%q", n)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "table ip %s\n", NFTTable)
	fmt.Fprintf(&b, "delete table ip %s\n", NFTTable)
	fmt.Fprintf(&b, "table ip %s {\n", NFTTable)
	fmt.Fprintf(&b, "\tcounter %s {\n\t}\n", NFTInfraCounter)
	b.WriteString("\tchain prerouting {\n")
	b.WriteString("\t\ttype filter hook prerouting priority mangle; policy accept;\n")
	if infra := c.InfrastructurePrefixes(); len(infra) > 0 {
		ps := make([]string, len(infra))
		for i, p := range infra {
			ps[i] = p.String()
		}
		fmt.Fprintf(&b, "\t\tiifname { %s } ip daddr { %s } counter name %q drop\n", strings.Join(ifs, ", "), strings.Join(ps, ", "), NFTInfraCounter)
	}
	fmt.Fprintf(&b, "\t\tiifname { %s } meta l4proto tcp fib daddr type != local tproxy to 127.0.0.1:%d meta mark set 0x%x accept\n",
		strings.Join(ifs, ", "), c.ListenPort, c.FWMark)
	b.WriteString("\t}\n}\n")
	return b.String()
}

// NFTInfraCounter is the named counter of the users' packets dropped for
// an infrastructure address; status shows it as infrastructure_dropped.
const NFTInfraCounter = "infrastructure"

// ParseNFTCounter reads the packets of a named counter from `nft -j list
// counter` output.
func ParseNFTCounter(out []byte, name string) (uint64, error) {
	var doc struct {
		Nftables []struct {
			Counter *struct {
				Name    string `json:"name"`
				Packets uint64 `json:"packets"`
			} `json:"counter"`
		} `json:"nftables"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		return 0, fmt.Errorf("nft counter %s: %w", name, err)
	}
	for _, o := range doc.Nftables {
		if o.Counter != nil && o.Counter.Name == name {
			return o.Counter.Packets, nil
		}
	}
	return 0, fmt.Errorf("nft counter %s: not in nft's output", name)
}

// NFTDelete is the script that removes the gateway's table.
func NFTDelete() string { return fmt.Sprintf("delete table ip %s\n", NFTTable) }
