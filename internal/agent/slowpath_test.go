package agent

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"

	"github.com/onehop/onehop/internal/datapath"
)

// record is a struct slowpath_event as the datapath submits it: the
// generated twin, written in the machine's order.
func record(t *testing.T, ev datapath.SlowpathEvent) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := binary.Write(&buf, binary.NativeEndian, &ev); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestSlowPathRecordIsDecodedIntoItsGeneratedType(t *testing.T) {
	ev := datapath.SlowpathEvent{Kind: uint32(datapath.SlowHold), Ifindex: 7, Len: 3, OrigLen: 1600}
	copy(ev.Data[:], "abc")
	got, err := decodeSlowPath(record(t, ev))
	if err != nil {
		t.Fatal(err)
	}
	if got.kind != datapath.SlowHold || got.ifindex != 7 || got.origLen != 1600 || string(got.frame) != "abc" {
		t.Fatalf("decoded %+v", got)
	}
}

func TestSlowPathRecordThatLiesAboutItsLengthIsRefused(t *testing.T) {
	for name, c := range map[string]struct {
		ev   datapath.SlowpathEvent
		cut  int
		want string
	}{
		"longer than its data":  {datapath.SlowpathEvent{Len: 5000, OrigLen: 5000}, 0, "claims 5000 bytes"},
		"more than its frame":   {datapath.SlowpathEvent{Len: 100, OrigLen: 60}, 0, "100 bytes of a 60-byte frame"},
		"cut short by the ring": {datapath.SlowpathEvent{Len: 1, OrigLen: 1}, 100, "-byte record"},
	} {
		t.Run(name, func(t *testing.T) {
			b := record(t, c.ev)
			if c.cut > 0 {
				b = b[:c.cut]
			}
			_, err := decodeSlowPath(b)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err %v, want it to say %q", err, c.want)
			}
		})
	}
}
