package vnatloc

import (
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"github.com/onehop/onehop/internal/accept/accepttest"
	"github.com/onehop/onehop/internal/testenv"
	"github.com/onehop/onehop/internal/vcmp"
)

// locate is one exchange, a daemon's locate walk's last resort.
func locate(c net.Conn) error {
	c.SetDeadline(time.Now().Add(10 * time.Second)) //nolint:errcheck // TCP takes deadlines
	ans, err := vcmp.Exchange(c, []vcmp.Message{&vcmp.LocQuery{Record: vcmp.Record{Conn: extConn, Phys: extNow}}})
	if err != nil {
		return err
	}
	if _, ok := ans[0].(*vcmp.LocAnswer); !ok {
		return errors.New("no location answer")
	}
	return nil
}

// TestOneSourceHoldingItsStreamsLeavesOthersServed is issue 20's item 4:
// one source opens more idle streams than the old global cap (256) and
// holds them; another source must still be answered, and the idle streams
// end after the idle timeout. Control first: both sources are answered.
func TestOneSourceHoldingItsStreamsLeavesOthersServed(t *testing.T) {
	s, _, _, _ := newService(t)
	s.cfg.Streams.Idle = 300 * time.Millisecond // the default 5 s, shortened for the test
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(t.Context(), l) //nolint:errcheck // ends with the test's context

	const attacker, victim = "127.0.0.1", "127.0.0.2"
	for _, src := range []string{attacker, victim} {
		c := accepttest.DialFrom(t, l.Addr(), src)
		if err := locate(c); err != nil {
			t.Fatalf("control: a query from %s: %v", src, err)
		}
		c.Close()
	}
	testenv.Eventually(t, "the control streams closed", 10*time.Second, func() bool { return s.Streams()["open"] == 0 })

	// The kernel hands connections over in the order they were made: the
	// attacker's are all taken before the victim's.
	const flood = 300
	var held []net.Conn
	for range flood {
		held = append(held, accepttest.DialFrom(t, l.Addr(), attacker))
	}
	if err := locate(accepttest.DialFrom(t, l.Addr(), victim)); err != nil {
		t.Fatalf("a query from %s while %s holds %d idle streams: %v (counts %v)", victim, attacker, flood, err, s.Streams())
	}
	per := s.cfg.Streams.PerSource
	testenv.Eventually(t, "the attacker's streams over its cap refused", 10*time.Second, func() bool {
		return s.Streams()["refused_per_source"] == uint64(flood-per)
	})

	// The streams it holds end once idle: read each to its end.
	ended := 0
	for _, c := range held {
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Read(make([]byte, 1)); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			ended++
		}
	}
	if ended != flood {
		t.Fatalf("%d of the %d idle streams ended, want all (counts %v)", ended, flood, s.Streams())
	}
	testenv.Eventually(t, "the held streams counted as idle", 10*time.Second, func() bool {
		return s.Streams()["idle_closed"] == uint64(per)
	})
	if got := s.Streams()["refused_total"]; got != 0 {
		t.Fatalf("refused_total %d, want 0: the per-source cap held first", got)
	}
}
