/* North-south egress's map records (lib/egress_maps.h), for internal/egress's
 * Go types only: egress is a stage of the router's programs (vif.c,
 * uplink.c), whose object holds its maps, so this object is never loaded.
 * bpf2go -type generates the records from it, the same C the router is
 * built from. */
#include "lib/egress_maps.h"

/* Types only the Go side reads: these references put them in BTF. */
const enum egress_addr_kind *_egress_addr_kind_type __attribute__((unused));
const enum egress_owner_kind *_egress_owner_kind_type __attribute__((unused));
