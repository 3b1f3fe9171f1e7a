/* Virtual TAP's map records (lib/tap_maps.h), for internal/tap's Go types
 * only: TAP is a stage of the router's programs (vif.c, uplink.c), whose
 * object holds its maps, so this object is never loaded. bpf2go -type
 * generates the records from it, the same C the router is built from. */
#include "lib/tap_maps.h"
