package vnatd

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"testing"

	"github.com/onehop/onehop/internal/accept"
	"github.com/onehop/onehop/internal/accept/accepttest"
	"github.com/onehop/onehop/internal/vcmp"
)

// TestVCMPServesAgainAfterADescriptorFlood is issue 20's attack on a VM's
// daemon: idle connections until accept fails with EMFILE (the child's
// RLIMIT_NOFILE lowered). The daemon's accept loop used to return then,
// leaving the process alive and deaf; it must wait the flood out and
// answer VCMP again once it is gone. Control first: a query is answered
// before the flood.
func TestVCMPServesAgainAfterADescriptorFlood(t *testing.T) {
	if accepttest.IsChild() {
		log := slog.New(slog.NewTextHandler(os.Stderr, nil))
		e := New(Config{Logger: log}, &fakeTr{xlate: map[vcmp.Tuple]vcmp.Tuple{}}, nil)
		accepttest.ServeChild(func(l net.Listener) {
			serveVCMP(context.Background(), e, accept.Wrap(l, accept.Options{Name: "vcmp", Limits: DefaultVCMPLimits, Log: log}), log)
		})
	}
	conn := vcmp.Tuple{Proto: vcmp.TCP, Local: netip.MustParseAddrPort("10.1.1.2:40000"), Remote: netip.MustParseAddrPort("10.1.2.2:7100")}
	accepttest.FloodAndRecover(t, "TestVCMPServesAgainAfterADescriptorFlood", func(c net.Conn) error {
		ans, err := vcmp.Exchange(c, []vcmp.Message{vcmp.Query(vcmp.Record{Conn: conn, Phys: netip.MustParseAddrPort("10.1.3.4:40000")})})
		if err != nil {
			return err
		}
		if len(ans) != 1 {
			return fmt.Errorf("%d answers to one query", len(ans))
		}
		if _, ok := ans[0].(*vcmp.LocAnswer); !ok {
			return fmt.Errorf("answer %T, want a location answer", ans[0])
		}
		return nil
	})
}
