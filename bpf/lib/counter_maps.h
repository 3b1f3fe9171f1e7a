/* What the datapath tells the operator: per-reason drop and per-path forward
 * counters, and one ring-buffer record per drop for the agent's log. Owned
 * by the datapath; counters live as long as the pins, records until read. */
#ifndef ONEHOP_COUNTER_MAPS_H
#define ONEHOP_COUNTER_MAPS_H

#include "common.h"
#include "trace.h"

/* Per-CPU so counting costs no atomic on the hot path. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, DROP_REASON_MAX);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} drops SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, FWD_PATH_MAX);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} forwards SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} drop_events SEC(".maps");

static __always_inline void count_forward(__u32 path)
{
	if (trace_mode) {
		trace_forward(path);
		return;
	}
	__u64 *n = bpf_map_lookup_elem(&forwards, &path);
	if (n)
		*n += 1;
}

#endif
