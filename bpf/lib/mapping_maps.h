/* The per-node mapping table (paper §2, "The VNET ARP engine"): owned by the
 * datapath, which learns it from the fabric; the agent's ARP engine ages it
 * (an entry unused for 5 minutes, or whose host stops answering, goes), the
 * LRU bounds it, and the agent forgets a VM's entry once the VM leaves the
 * intent (agent/purge.go). The agent never writes it from intent. */
#ifndef ONEHOP_MAPPING_MAPS_H
#define ONEHOP_MAPPING_MAPS_H

#include "common.h"

/* One entry: the host that holds a remote VM, learned from ARP replies and
 * from the fabric's own traffic. A fixed-size LRU: a lookup refreshes an
 * entry, and a full table forgets its least recently used one. An all-zero
 * host_mac means "asked, not yet answered": it rate-limits the fabric ARP
 * for that address. */
struct mapping {
	__u8 host_mac[ETH_ALEN];
	__u16 held;         /* while asking: packets handed to the agent since the last ask */
	__u64 confirmed_ns; /* last ARP reply or announcement (or the last ask, while unanswered) */
	__u64 used_ns;      /* last packet sent with it, in steps of MAPPING_USE_STEP_NS */
};

#define MAPPING_USE_STEP_NS 1000000000ULL
/* How often a VM's unanswered ARP may go to the fabric for one address. */
#define MAPPING_ASK_INTERVAL_NS 1000000000ULL
/* Packets for one unmapped address handed to the agent per ask interval
 * (the agent holds as many): beyond, they are dropped in the kernel. */
#define HOLD_PER_ASK 16

/* The agent may size it at load (--mapping-table-size). */
#define MAX_MAPPINGS 16384

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MAX_MAPPINGS);
	__type(key, __be32);
	__type(value, struct mapping);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} mappings SEC(".maps");

#endif
