/* onehop observe's maps: the bounds the agent sets and each farm's budget
 * of events. The records themselves go through drop_events
 * (counter_maps.h), the one ring the agent reads. */
#ifndef ONEHOP_OBSERVE_MAPS_H
#define ONEHOP_OBSERVE_MAPS_H

#include "common.h"

/* One budget per farm id (0: no farm: slivers, the fabric, management),
 * enough for a 12-bit farm plan (addressing.md); a power of two, so a
 * wider plan folds onto it (observe.h). */
#define OBSERVE_FARMS 4096

/* Defaults while the agent has set nothing (a zero field): one event per
 * millisecond per farm and CPU, in bursts of up to 256. */
#define OBSERVE_NS_PER_EVENT 1000000ULL
#define OBSERVE_BURST 256

struct observe_limits {
	__u32 flows;        /* 1 while someone observes: admitted flows are published too */
	__u32 ns_per_event; /* a farm's refill, per CPU: one event per this many ns */
	__u32 burst;        /* a farm's bucket depth, per CPU */
	__u32 _pad;
};

/* A farm's token bucket on one CPU, and what it could not publish. */
struct observe_bucket {
	__u64 stamp;  /* ns: the bucket was full, or last refilled, then */
	__u64 tokens; /* events it may publish now */
	__u64 lost;   /* events refused: over the farm's rate, or the ring full */
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct observe_limits);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} observe_config SEC(".maps");

/* Per-CPU: a bucket costs no atomic, and a farm's bound on a host is its
 * rate times the CPUs that see its packets. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, OBSERVE_FARMS);
	__type(key, __u32);
	__type(value, struct observe_bucket);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} observe_budget SEC(".maps");

#endif
