/* VNAT's maps (paper §3.1–3.2). Types shared with Go through bpf2go -type.
 *
 * vnat_xlate holds both directions of every migrated connection, each
 * keyed by the tuple a packet carries at that hook:
 *   egress:  the virtual tuple the socket wrote (local virt -> remote virt),
 *            rewritten to the physical one (local phys -> remote phys);
 *   ingress: the physical tuple off the wire (remote phys -> local phys),
 *            rewritten to the virtual one (remote virt -> local virt).
 * The daemon writes both entries of a connection together (internal/vnat
 * builds them from one Virtual/Physical pair), so one lookup per packet
 * decides. vnat_conns is the datapath's own record of established TCP
 * connections (sockops), an LRU that ages on its own. */
#ifndef ONEHOP_VNAT_MAPS_H
#define ONEHOP_VNAT_MAPS_H

#include "common.h"

enum vnat_dir {
	VNAT_EGRESS = 0,
	VNAT_INGRESS = 1,
};

/* A packet's IPv4 5-tuple as it is at one hook, plus that hook. */
struct vnat_tuple {
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
	__u8 proto; /* IPPROTO_TCP or IPPROTO_UDP */
	__u8 dir;   /* enum vnat_dir */
	__u16 _pad;
};

/* What the tuple becomes. Fields equal to the packet's are left alone. */
struct vnat_rewrite {
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
	__u32 _pad;
};

/* Single slot. migrated counts the connections in vnat_xlate: while it is
 * 0 the tc programs return before parsing anything (paper §3.2: a
 * connection that never moved is never translated and costs nothing). */
struct vnat_config {
	__u32 migrated;
	__u32 helpers; /* connections in vnat_away (their peer is away) */
};

/* vnat_away's value: a TCP connection whose peer is away (keyed by its
 * vnat_conn_key, the local end's virtual view, as egress sees it before
 * translation). The keepalive helper (vnat_helper.h) answers its
 * keepalive probes. snd_nxt and window are what the programs saw since
 * the daemon marked it, used only for packets that come without their
 * socket (seen says which are known). */
struct vnat_helper {
	__u64 answered; /* keepalive probes answered for this connection */
	__u32 snd_nxt;  /* host order: end of the last segment seen leaving */
	__u16 window;   /* host order: the window field last seen from the peer */
	__u8 seen;      /* VNAT_HELPER_SEEN_* */
	__u8 _pad;
};

#define VNAT_HELPER_SEEN_NXT 0x01
#define VNAT_HELPER_SEEN_WIN 0x02

/* A TCP connection as sockops saw it, keyed from the local end's view. */
struct vnat_conn_key {
	__be32 laddr;
	__be32 raddr;
	__be16 lport;
	__be16 rport;
	__u8 proto;
	__u8 _pad[3];
};

struct vnat_conn {
	__u64 cookie;         /* socket cookie, stable for the socket's life */
	__u64 established_ns; /* bpf_ktime_get_ns() at establishment */
	__u32 state;          /* TCP state (linux/tcp.h TCP_ESTABLISHED, ...) */
	__u32 _pad;
};

/* Per-CPU counters, indexed by this enum (Go reads the names from BTF). */
enum vnat_counter {
	VNAT_EGRESS_TRANSLATED = 0,
	VNAT_INGRESS_TRANSLATED,
	VNAT_TRANSLATE_ERRORS,  /* a helper failed; the packet went on as it was */
	VNAT_FRAGMENTS_SKIPPED, /* IPv4 fragments seen while something is migrated */
	VNAT_CONNS_RECORDED,
	VNAT_CONNS_CLOSED,
	VNAT_KEEPALIVES_ANSWERED,   /* probes of a marked connection answered here */
	VNAT_KEEPALIVES_UNANSWERED, /* probes recognised but not answerable (options, no window) */
	VNAT_KEEPALIVE_ERRORS,      /* a helper failed halfway; the probe was dropped */
	VNAT_COUNTER_MAX,
};

#ifndef VNAT_XLATE_ENTRIES
#define VNAT_XLATE_ENTRIES 65536 /* two per migrated connection */
#endif
#ifndef VNAT_CONN_ENTRIES
#define VNAT_CONN_ENTRIES 65536
#endif
#ifndef VNAT_HELPER_ENTRIES
#define VNAT_HELPER_ENTRIES 65536
#endif

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, VNAT_XLATE_ENTRIES);
	__type(key, struct vnat_tuple);
	__type(value, struct vnat_rewrite);
} vnat_xlate SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct vnat_config);
} vnat_state SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, VNAT_CONN_ENTRIES);
	__type(key, struct vnat_conn_key);
	__type(value, struct vnat_conn);
} vnat_conns SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, VNAT_HELPER_ENTRIES);
	__type(key, struct vnat_conn_key);
	__type(value, struct vnat_helper);
} vnat_away SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, VNAT_COUNTER_MAX);
	__type(key, __u32);
	__type(value, __u64);
} vnat_counters SEC(".maps");

static __always_inline void vnat_count(__u32 c)
{
	__u64 *v = bpf_map_lookup_elem(&vnat_counters, &c);

	if (v)
		*v += 1;
}

#endif
