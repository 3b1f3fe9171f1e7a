package gateway

import (
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
func NFTRules(c *Config) string {
	ifs := make([]string, len(c.Intercept))
	for i, n := range c.Intercept {
		ifs[i] = fmt.Sprintf("%q", n)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "table ip %s\n", NFTTable)
	fmt.Fprintf(&b, "delete table ip %s\n", NFTTable)
	fmt.Fprintf(&b, "table ip %s {\n", NFTTable)
	b.WriteString("\tchain prerouting {\n")
	b.WriteString("\t\ttype filter hook prerouting priority mangle; policy accept;\n")
	fmt.Fprintf(&b, "\t\tiifname { %s } meta l4proto tcp fib daddr type != local tproxy to 127.0.0.1:%d meta mark set 0x%x accept\n",
		strings.Join(ifs, ", "), c.ListenPort, c.FWMark)
	b.WriteString("\t}\n}\n")
	return b.String()
}

// NFTDelete is the script that removes the gateway's table.
func NFTDelete() string { return fmt.Sprintf("delete table ip %s\n", NFTTable) }
