/* Connection tracking: owned by the datapath, which creates an entry when a
 * rule admits a flow's first packet and refreshes it as the flow goes on.
 * Bounded twice: the LRU forgets the least recently used flows when full,
 * and an entry idle for CT_TIMEOUT_NS (conntrack.h) no longer admits
 * anything. The agent never writes it. */
#ifndef ONEHOP_CONNTRACK_MAPS_H
#define ONEHOP_CONNTRACK_MAPS_H

#include "common.h"

#define MAX_FLOWS 65536

/* One entry per flow, the same from both directions: the endpoint with the
 * lower (address, port) is a, the other b. */
struct ct_key {
	__be32 addr_a;
	__be32 addr_b;
	__be16 port_a; /* TCP/UDP port, or the ICMP echo id */
	__be16 port_b;
	__u8 proto;
	__u8 _pad[3];
};

/* Which way a rule opened the flow: replies are the other way. */
#define CT_OPENED_AB 1
#define CT_OPENED_BA 2
#define CT_OPENED_BOTH (CT_OPENED_AB | CT_OPENED_BA)
/* The flow was cut when the rules stopped admitting it the way it was
 * opened: its packets are refused until they admit it again (policy.h,
 * ct_recheck). */
#define CT_CUT 4

struct ct_entry {
	__u64 last_seen_ns;
	__u32 epoch;  /* the node's policy_epoch when the flow was last admitted */
	__u8 opened;  /* CT_OPENED_AB and/or CT_OPENED_BA, and CT_CUT */
	__u8 _pad[3]; /* room for a per-VM owner or counter */
};

/* LRU: under pressure the oldest flows are forgotten, never new ones refused. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MAX_FLOWS);
	__type(key, struct ct_key);
	__type(value, struct ct_entry);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} conntrack SEC(".maps");

#endif
