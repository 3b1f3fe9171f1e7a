/* Each local VM's share of what every tenant shares (share.h): the limits
 * the agent writes (reconciled) and the buckets the datapath keeps per VM
 * (owned by the datapath; the agent removes a VM's entry when it leaves the
 * host, and the LRU bounds them). */
#ifndef ONEHOP_SHARE_MAPS_H
#define ONEHOP_SHARE_MAPS_H

#include "common.h"

enum share_kind {
	SHARE_FLOWS = 0, /* new conntrack entries the VM's traffic opens */
	SHARE_ASKS,      /* mapping-table placeholders: addresses asked about */
	SHARE_PUNTS,     /* frames handed to the agent (DHCP, held packets) */
	SHARE_KINDS,
};

/* Written by the agent: per kind, the interval between units (ns) and how
 * far ahead of now a VM's bucket may run (the burst, in ns of intervals). */
struct share_limits {
	__u64 interval_ns[SHARE_KINDS];
	__u64 burst_ns[SHARE_KINDS];
};

/* Owned by the datapath, per local VM (by its IPv4): its buckets and what it
 * was refused. The agent removes a VM's entry when it leaves the host. */
struct vm_share {
	__u64 next_ns[SHARE_KINDS];
	__u64 refused[SHARE_KINDS];
};

#define MAX_SHARES 4096 /* this host's VMs, as endpoints */

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct share_limits);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} share_config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MAX_SHARES);
	__type(key, __be32);
	__type(value, struct vm_share);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} vm_shares SEC(".maps");

#endif
