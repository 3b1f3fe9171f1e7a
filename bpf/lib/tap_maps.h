/* Virtual TAP's maps (tap.h, docs/tap.md).
 *
 * Reconciled by the agent (internal/tap Sync): the rules by slot
 * (tap_rules), where their copies go (tap_targets), the match index
 * (tap_index: which rule slots a sender or receiver address can match) and
 * the copy rate each monitor may take (tap_config).
 * Owned by the datapath: each target's rate bucket (tap_buckets, reset when
 * a target takes a slot), the per-rule counters (tap_stats, zeroed when a rule takes a slot) and a
 * per-CPU scratch to build a collector's copy in (tap_scratch). */
#ifndef ONEHOP_TAP_MAPS_H
#define ONEHOP_TAP_MAPS_H

#include "common.h"

/* internal/limits.MaxTapRules (a test compares): rules are slots
 * 0..TAP_MAX_RULES-1. */
#define TAP_MAX_RULES 256
#define TAP_WORDS (TAP_MAX_RULES / 64)
/* internal/limits.MaxTapTargets: distinct monitors (local VMs, remote hosts) one
 * host's rules copy to. One 64-bit set per packet keeps the walk's stack
 * small (tap.h). */
#define TAP_MAX_TARGETS 64
/* Keys of tap_index: local senders (one per local VM) plus, per rule, at
 * most one key per side and role. */
#define TAP_MAX_INDEX 8192

/* A set of rule (or target) slots. */
struct tap_bits {
	__u64 w[TAP_WORDS];
};

enum tap_role {
	TAP_ROLE_COPY = 0, /* the sender's edge: a local VM sent it */
	TAP_ROLE_RECOVER,  /* the monitor's edge: a copy from the fabric */
};

enum tap_side {
	TAP_SIDE_SENDER = 0,
	TAP_SIDE_RECEIVER,
};

enum tap_key_kind {
	TAP_KEY_IP = 0,  /* addr is one VM's */
	TAP_KEY_SEGMENT, /* addr is 0.f.s.0: a whole subnet */
	TAP_KEY_ANY,     /* addr is 0.f.0.0: any VM of farm f */
};

/* Which rule slots an address can match on one side, for one role. The
 * copy role's sender keys are exact (one per local VM: the rules naming it,
 * its subnet or any, each VLAN filter already applied); every other side
 * is looked up as the address, its segment and any, and the three OR'd. */
struct tap_key {
	__be32 addr;
	__u8 role;
	__u8 side;
	__u8 kind;
	__u8 _pad;
};

/* A rule's filters beside sender and receiver (the index has those), and
 * its monitor's target slot. Ports apply to TCP and UDP only: a rule with a
 * port range matches no other protocol (and no later fragment). */
struct tap_rule {
	__u32 id; /* intent.TapRule.ID */
	__u32 target;
	__u8 proto; /* 0: any */
	__u8 ports; /* 1: the port ranges below apply */
	__u16 sport_lo;
	__u16 sport_hi;
	__u16 dport_lo;
	__u16 dport_hi;
	__u16 _pad;
};

/* How copies to a collector on the fabric are wrapped (enum, in BTF for
 * the Go side). */
enum tap_encap {
	TAP_ENCAP_NONE = 0,
	TAP_ENCAP_GRE,     /* GRE (0x6558, no options) + the Ethernet frame */
	TAP_ENCAP_ERSPAN2, /* GRE (0x88BE, sequenced) + ERSPAN type II */
	TAP_ENCAP_ERSPAN3, /* GRE (0x22EB, sequenced) + ERSPAN type III */
};

/* Bytes before the copied frame, outer Ethernet included: 14 + IPv4 20 +
 * GRE 4 | GRE 8 + ERSPAN II 8 | GRE 8 + ERSPAN III 12. */
#define TAP_ENCAP_GRE_LEN 38
#define TAP_ENCAP_ERSPAN2_LEN 50
#define TAP_ENCAP_ERSPAN3_LEN 54
/* The template: the longest header and the inner EtherType after it. */
#define TAP_ENCAP_MAX 72

/* Where one monitor's copies go: into a local monitor's vif (ifindex), or
 * to the uplink MAC of the monitor's host (remote), or wrapped (encap) to
 * a collector: then hdr holds the outer headers, as the agent builds them
 * (the collector's MAC and address, the host's) and the inner EtherType
 * after them, with the outer IPv4 total length 0 and its checksum over
 * that; the datapath sets the length,
 * fixes the checksum, and fills the GRE sequence number (seq) and the
 * ERSPAN III timestamp. */
struct tap_target {
	__u32 ifindex;
	__u8 host_mac[ETH_ALEN];
	__u8 remote;
	__u8 encap; /* enum tap_encap */
	/* The datapath's: the next GRE sequence number. The agent writes 0
	 * whenever it writes the target. */
	__u32 seq;
	__u8 hdr[TAP_ENCAP_MAX];
};

/* A copy to a collector as it is put together (per CPU: no stack). */
struct tap_scratch {
	__u8 b[80]; /* the longest header (hlen & 0x3f, for the verifier) and an Ethernet header */
	__u32 hlen; /* the header's length */
};

/* The copy rate one target may take (GCRA, as share.h): the interval
 * between copies and how far ahead of now its bucket may run. */
struct tap_limits {
	__u64 interval_ns;
	__u64 burst_ns;
};

/* One rule's copies on one CPU: made at the sender's edge (copied), handed
 * to a local monitor from the fabric (delivered), lost to the monitor's
 * rate or a failed clone (dropped). */
struct tap_counters {
	__u64 copied_packets;
	__u64 copied_bytes;
	__u64 delivered_packets;
	__u64 delivered_bytes;
	__u64 dropped;
};

/* Only the Go side names these: in BTF for bpf2go -type. */
const enum tap_role *_tap_role_type __attribute__((unused));
const enum tap_side *_tap_side_type __attribute__((unused));
const enum tap_key_kind *_tap_key_kind_type __attribute__((unused));
const enum tap_encap *_tap_encap_type __attribute__((unused));

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, TAP_MAX_RULES);
	__type(key, __u32);
	__type(value, struct tap_rule);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tap_rules SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, TAP_MAX_TARGETS);
	__type(key, __u32);
	__type(value, struct tap_target);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tap_targets SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, TAP_MAX_INDEX);
	__type(key, struct tap_key);
	__type(value, struct tap_bits);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tap_index SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct tap_limits);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tap_config SEC(".maps");

/* Each target's next allowed copy (ns), racy across CPUs: a bound, not an
 * exact count. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, TAP_MAX_TARGETS);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tap_buckets SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct tap_scratch);
	__uint(pinning, LIBBPF_PIN_BY_NAME); /* as every map the feature declares; it holds nothing between packets */
} tap_scratch SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, TAP_MAX_RULES);
	__type(key, __u32);
	__type(value, struct tap_counters);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} tap_stats SEC(".maps");

#endif
