package tap

import (
	"fmt"

	"github.com/onehop/onehop/internal/tappolicy"
)

// Encapsulations of copies to a collector (enum tap_encap in
// bpf/lib/tap_maps.h), by the names policies give them; their headers
// are internal/tapwire's.
var encapKinds = map[string]uint8{
	tappolicy.EncapGRE:     uint8(tapTapEncapTAP_ENCAP_GRE),
	tappolicy.EncapERSPAN2: uint8(tapTapEncapTAP_ENCAP_ERSPAN2),
	tappolicy.EncapERSPAN3: uint8(tapTapEncapTAP_ENCAP_ERSPAN3),
}

func (c collectorTarget) String() string {
	if c.addr == "" {
		return ""
	}
	return fmt.Sprintf("%s/%s/%d/%s/%s", c.addr, c.encap, c.session, c.mac, c.src)
}
