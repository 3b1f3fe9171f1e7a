package netns

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// SNMP reads one counter of /proc/net/snmp (proto "Udp", field
// "InCsumErrors", say) as namespace name sees it: the kernel's own count
// of what its stack refused, which tests read to prove a checksum or a
// length the datapath wrote was accepted.
func SNMP(name, proto, field string) (uint64, error) {
	return procCounter(name, "snmp", proto, field)
}

// Netstat reads one counter of /proc/net/netstat (proto "TcpExt", field
// "OutOfWindowIcmps", say) as namespace name sees it: the stack's finer
// counts, in the same layout as /proc/net/snmp.
func Netstat(name, proto, field string) (uint64, error) {
	return procCounter(name, "netstat", proto, field)
}

// procCounter reads proto's field of the table /proc/net/<file> in
// namespace name.
func procCounter(name, file, proto, field string) (uint64, error) {
	var val uint64
	err := Do(name, func() error {
		// thread-self: the namespace of this (locked) thread, not of
		// the process.
		f, err := os.Open("/proc/thread-self/net/" + file)
		if err != nil {
			return err
		}
		defer f.Close()
		val, err = snmpCounter(f, proto, field)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("netns %s: /proc/net/%s: %w", name, file, err)
	}
	return val, nil
}

// snmpCounter finds proto's field in the table r (/proc/net/snmp or
// netstat): each protocol has a header line of field names and a line of
// values, both "Proto: ...".
func snmpCounter(r io.Reader, proto, field string) (uint64, error) {
	var header []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 || fields[0] != proto+":" {
			continue
		}
		if header == nil {
			header = fields
			continue
		}
		for i, h := range header {
			if h == field && i < len(fields) {
				return strconv.ParseUint(fields[i], 10, 64)
			}
		}
		break
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no %s %s", proto, field)
}
