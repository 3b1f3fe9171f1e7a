/* Who is a host on the fabric (fabric_trust.h): `hosts` is reconciled by
 * the agent from the store's node records; `mapping_claims` is owned by the
 * datapath, an LRU of when each claim last went to the agent. */
#ifndef ONEHOP_FABRIC_TRUST_MAPS_H
#define ONEHOP_FABRIC_TRUST_MAPS_H

#include "common.h"

struct host_key {
	__u8 mac[ETH_ALEN];
	__u16 _pad;
};

#define MAX_HOSTS 4096

/* The uplink MACs of the other hosts, from the store's node records. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_HOSTS);
	__type(key, struct host_key);
	__type(value, __u8);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} hosts SEC(".maps");

/* When a claim about a VM last went to the agent, and from which host, so a
 * host repeating its claim costs the agent one store lookup per address and
 * second, while another host's claim (the VM moved on again) goes at once. */
#define CLAIM_INTERVAL_NS 1000000000ULL
struct claim_seen {
	__u64 at_ns;
	__u8 host_mac[ETH_ALEN];
	__u16 _pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1024);
	__type(key, __be32);
	__type(value, struct claim_seen);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} mapping_claims SEC(".maps");

#endif
