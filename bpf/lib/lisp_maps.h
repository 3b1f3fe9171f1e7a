/* The LISP data plane's maps (RFC 9300). Types shared with Go through
 * bpf2go -type; internal/lispdp writes every map but the counters.
 *
 *   lisp_paths    array, path id -> the tunnel: interface, local and remote
 *                 RLOC, MACs, instance id, MTU (flags: configured, I bit)
 *   lisp_eids     LPM trie, EID prefix -> which paths carry it: 32 hash
 *                 slots filled by weight among the best-priority RLOCs, a
 *                 bitmap of every usable path (what a pin may take), and
 *                 every path listed (whose remote RLOCs may send from it)
 *   lisp_pins     hash, inner source -> path id (one MPTCP subflow per path)
 *   lisp_tunnels  hash, {local RLOC, remote RLOC} -> path id: what
 *                 decapsulation accepts
 *   lisp_locals   hash, local RLOC -> 1: LISP to one of these from an
 *                 unknown RLOC is dropped, not passed on
 *   lisp_sites    hash, ifindex of a site interface -> the netns id (in
 *                 this namespace) of the namespace at its far end, whose
 *                 own TCP sockets take superpackets whole
 *   lisp_path_stats per-CPU array, path id -> packets and bytes each way
 *   lisp_counters per-CPU array, enum lisp_counter -> packets */
#ifndef ONEHOP_LISP_MAPS_H
#define ONEHOP_LISP_MAPS_H

#include "common.h"

#define LISP_MAX_PATHS 256
#define LISP_SLOTS 32

enum lisp_path_flag {
	LISP_PATH_UP = 1 << 0,    /* configured: an array slot is never missing */
	LISP_PATH_IID = 1 << 1,   /* send the I bit and instance id; require it back */
	LISP_PATH_NEIGH = 1 << 2, /* no MACs given: the kernel's FIB and neighbour table fill them (bpf_redirect_neigh) */
};

struct lisp_path {
	__u32 ifindex;
	__be32 local_rloc;
	__be32 remote_rloc;
	__u32 iid; /* host order, low 24 bits */
	__u8 src_mac[ETH_ALEN];
	__u8 dst_mac[ETH_ALEN];
	__u16 mtu;  /* largest outer IPv4 packet */
	__u8 flags; /* enum lisp_path_flag */
	__u8 _pad;
};

struct lisp_eid_key {
	__u32 prefixlen;
	__be32 addr;
};

enum lisp_eid_flag {
	LISP_EID_NEGATIVE = 1 << 0, /* negative mapping: forward natively */
};

struct lisp_eid {
	__u8 flags;    /* enum lisp_eid_flag */
	__u8 nslots;   /* 0: no usable RLOC */
	__u8 nmembers; /* paths in members */
	__u8 _pad[5];
	__u8 slots[LISP_SLOTS];            /* path ids, by weight, among the best priority */
	__u8 members[LISP_SLOTS];          /* every path the mapping lists, whatever its priority: decapsulation takes the prefix as inner source only from their remote RLOCs */
	__u64 usable[LISP_MAX_PATHS / 64]; /* bit per path with priority < 255 */
};

struct lisp_tunnel_key {
	__be32 local_rloc;
	__be32 remote_rloc;
};

struct lisp_stats {
	__u64 tx_packets;
	__u64 tx_bytes;
	__u64 rx_packets;
	__u64 rx_bytes;
};

/* Per-CPU counters, indexed by this enum (Go reads the names from BTF:
 * LISP_DROP_X is "drop_x"). */
enum lisp_counter {
	LISP_ENCAPSULATED = 0,  /* encapsulated and sent on a path */
	LISP_PINNED,            /* ... of which the path came from a pin */
	LISP_DECAPSULATED,      /* decapsulated and handed on */
	LISP_NATIVE,            /* negative mapping: forwarded natively */
	LISP_ICMP_TOO_BIG,      /* a DF packet too big for its path, answered with ICMP fragmentation needed */
	LISP_DROP_MALFORMED,    /* LISP to us that does not parse: short, N and V both set, inner not IPv4 or lengths disagree, outer IP options */
	LISP_DROP_UNKNOWN_RLOC, /* LISP to a local RLOC from a remote RLOC no path names */
	LISP_DROP_WRONG_IID,    /* instance id other than the path's (or one the path does not use) */
	LISP_DROP_NO_PATH,      /* mapped EID but no usable RLOC, or a slot naming an unconfigured path */
	LISP_DROP_TOO_BIG,      /* would exceed the path MTU once encapsulated (never fragmented); without DF, or the ICMP answer could not be made */
	LISP_DROP_FRAGMENT,     /* an outer IPv4 fragment of LISP: nothing here reassembles */
	LISP_DROP_ENCAP_FAILED, /* bpf_skb_adjust_room refused to open room */
	LISP_DROP_DECAP_FAILED, /* bpf_skb_adjust_room refused to close it */
	LISP_DROP_GSO_DECAP,    /* a GSO superpacket the kernel cannot decapsulate in place (no BPF_F_ADJ_ROOM_DECAP_L4_UDP) */
	LISP_DROP_ECN,          /* outer CE over a not-ECT inner packet (RFC 6040 §4.2) */
	LISP_DECAP_LOCAL_GSO,   /* decapsulated, of which: a TCP superpacket for a socket of this node or of a lisp_sites namespace, stripped whole though the kernel keeps its tunnel GSO state */
	LISP_DROP_SOURCE_EID,   /* the inner source is no EID whose mapping lists the outer source as a locator */
	LISP_COUNTER_MAX,
};

#ifndef LISP_EID_ENTRIES
#define LISP_EID_ENTRIES 16384
#endif
#ifndef LISP_PIN_ENTRIES
#define LISP_PIN_ENTRIES 4096
#endif

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, LISP_MAX_PATHS);
	__type(key, __u32);
	__type(value, struct lisp_path);
} lisp_paths SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, LISP_EID_ENTRIES);
	__type(key, struct lisp_eid_key);
	__type(value, struct lisp_eid);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} lisp_eids SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LISP_PIN_ENTRIES);
	__type(key, __be32);
	__type(value, __u32);
} lisp_pins SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LISP_MAX_PATHS);
	__type(key, struct lisp_tunnel_key);
	__type(value, __u32);
} lisp_tunnels SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LISP_MAX_PATHS);
	__type(key, __be32);
	__type(value, __u32);
} lisp_locals SEC(".maps");

/* A few site interfaces at most: veths into server namespaces. */
#define LISP_MAX_SITES 64

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LISP_MAX_SITES);
	__type(key, __u32);   /* ifindex */
	__type(value, __s32); /* netns id, as bpf_sk_lookup_tcp takes it */
} lisp_sites SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, LISP_MAX_PATHS);
	__type(key, __u32);
	__type(value, struct lisp_stats);
} lisp_path_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, LISP_COUNTER_MAX);
	__type(key, __u32);
	__type(value, __u64);
} lisp_counters SEC(".maps");

static __always_inline void lisp_count(__u32 c)
{
	__u64 *v = bpf_map_lookup_elem(&lisp_counters, &c);

	if (v)
		*v += 1;
}

#endif
