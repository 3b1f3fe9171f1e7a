/* Port-space isolation's maps (portspace.h, docs/port-space-datapath.md).
 *
 * Reconciled by the agent (internal/portspace Sync): the uplinks and their
 * public addresses, the port array, the slivers and their links, the ARP
 * fan-out lists, the sliver cgroups and the share limits.
 * Owned by the datapath: fragment steering and ICMP echo ids (LRUs with a
 * per-sliver share each, so one sliver cannot flush another's entries), the
 * per-sliver shares and the per-sliver counters. */
#ifndef ONEHOP_PORTSPACE_MAPS_H
#define ONEHOP_PORTSPACE_MAPS_H

#include "common.h"

/* internal/limits: MaxUplinks, MaxSlivers (a test compares). */
#define PORTSPACE_MAX_UPLINKS 4
#define PORTSPACE_MAX_SLIVERS 16384
#define PORTSPACE_PORTS (PORTSPACE_MAX_UPLINKS * 65536)
#define PORTSPACE_FRAG_MAX 16384
#define PORTSPACE_ECHO_MAX 16384

/* One of the host's uplinks and the public address its slivers share. */
struct portspace_uplink {
	__u32 ifindex;
	__be32 addr;
	__u8 mac[ETH_ALEN];
	__u8 index;
	__u8 _pad;
	__u32 vifs; /* entries of portspace_fanout for this uplink */
};

/* A sliver, by slot: its host-side link per uplink (0: none) and, per
 * uplink, the range its rewritten ICMP echo ids are picked from (its
 * lowest lease there; lo > hi: none). */
struct portspace_sliver {
	__u32 vif[PORTSPACE_MAX_UPLINKS];
	__u16 echo_lo[PORTSPACE_MAX_UPLINKS];
	__u16 echo_hi[PORTSPACE_MAX_UPLINKS];
};

/* A sliver's host-side link: whose it is, which uplink it stands for, and
 * its own MAC (a frame for the host is given it, so the host's stack takes
 * the frame as its own). */
struct portspace_vif {
	__u32 slot;
	__u8 uplink;
	__u8 mac[ETH_ALEN];
	__u8 _pad;
};

enum portspace_share_kind {
	PORTSPACE_SHARE_FRAGS = 0, /* fragment-steering records */
	PORTSPACE_SHARE_ECHO,      /* ICMP echo-id records */
	PORTSPACE_SHARE_KINDS,
};

/* Written by the agent: per kind, the interval between a sliver's new
 * records and how far ahead of now its bucket may run (GCRA, as share.h). */
struct portspace_limits {
	__u64 interval_ns[PORTSPACE_SHARE_KINDS];
	__u64 burst_ns[PORTSPACE_SHARE_KINDS];
};

/* A sliver's buckets and what it was refused (datapath-owned, by slot). */
struct portspace_share {
	__u64 next_ns[PORTSPACE_SHARE_KINDS];
	__u64 refused[PORTSPACE_SHARE_KINDS];
};

/* Per-sliver drop counters: [0] malformed, [1 + r - DROP_PS_FIRST] for
 * each port-space reason r. */
#define PORTSPACE_DROP_SLOTS 16

/* A sliver's traffic, per CPU, by slot (slot 0: the host's own, unused). */
struct portspace_counters {
	__u64 packets_in;
	__u64 bytes_in;
	__u64 packets_out;
	__u64 bytes_out;
	__u64 drops[PORTSPACE_DROP_SLOTS];
};

/* A fragmented datagram: to a sliver (from the fabric or a hairpin; slot
 * 0 in the key, the steered-to slot in the value), or from one (dir 1,
 * its slot in the key). */
struct portspace_frag_key {
	__be32 remote;
	__be16 id;
	__u8 proto;
	__u8 uplink_dir; /* uplink index | 0x80 for a sliver's own datagram */
	__u32 slot;
};

struct portspace_frag {
	__u64 when_ns;
	__u32 slot;
	__u32 _pad;
};

/* An echo request a sliver sent: to remote, with this id on the wire. */
struct portspace_echo_key {
	__be32 remote;
	__be16 id;
	__u8 uplink;
	__u8 _pad;
};

struct portspace_echo {
	__be16 orig_id; /* the id the sliver chose, restored in the reply */
	__u16 _pad;
	__u32 slot;
};

struct portspace_fanout_key {
	__u32 uplink;
	__u32 index;
};

/* Uplinks by ifindex (the fabric side) and by index (the sliver side). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, PORTSPACE_MAX_UPLINKS);
	__type(key, __u32);
	__type(value, struct portspace_uplink);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} portspace_uplinks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, PORTSPACE_MAX_UPLINKS);
	__type(key, __u32);
	__type(value, struct portspace_uplink);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} portspace_uplink_index SEC(".maps");

/* Public address -> uplink index (the hairpin, lo, the cgroup hooks). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, PORTSPACE_MAX_UPLINKS);
	__type(key, __be32);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} portspace_addrs SEC(".maps");

/* index*65536 + port -> slot (0: the host's own). One array lookup steers
 * a packet however many leases there are. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, PORTSPACE_PORTS);
	__type(key, __u32);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} portspace_ports SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, PORTSPACE_MAX_SLIVERS + 1);
	__type(key, __u32);
	__type(value, struct portspace_sliver);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} portspace_slivers SEC(".maps");

/* Host-side sliver link ifindex -> whose. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, PORTSPACE_MAX_SLIVERS * PORTSPACE_MAX_UPLINKS);
	__type(key, __u32);
	__type(value, struct portspace_vif);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} portspace_vifs SEC(".maps");

/* (uplink, i) -> the i-th sliver link of that uplink, for ARP replies. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, PORTSPACE_MAX_SLIVERS * PORTSPACE_MAX_UPLINKS);
	__type(key, struct portspace_fanout_key);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} portspace_fanout SEC(".maps");

/* cgroup v2 id -> slot (portspace_sock.c). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, PORTSPACE_MAX_SLIVERS);
	__type(key, __u64);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} portspace_cgroups SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct portspace_limits);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} portspace_config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, PORTSPACE_MAX_SLIVERS + 1);
	__type(key, __u32);
	__type(value, struct portspace_share);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} portspace_shares SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, PORTSPACE_FRAG_MAX);
	__type(key, struct portspace_frag_key);
	__type(value, struct portspace_frag);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} portspace_frags SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, PORTSPACE_ECHO_MAX);
	__type(key, struct portspace_echo_key);
	__type(value, struct portspace_echo);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} portspace_echo_ids SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, PORTSPACE_MAX_SLIVERS + 1);
	__type(key, __u32);
	__type(value, struct portspace_counters);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} portspace_stats SEC(".maps");

/* Who leases port (host order) on uplink u: a slot, 0 for the host. The
 * steering, the sliver's checks and its socket programs all ask this. */
static __always_inline __u32 portspace_port_owner(__u32 u, __u16 port)
{
	__u32 key = (u << 16) | port;
	__u32 *slot = bpf_map_lookup_elem(&portspace_ports, &key);
	return slot ? *slot : 0;
}

#endif
