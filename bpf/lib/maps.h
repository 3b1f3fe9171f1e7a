/* Maps owned by the agent. Pinned by name so traffic keeps flowing while the
 * agent restarts; the agent reconciles their contents to etcd's desired state. */
#ifndef ONEHOP_MAPS_H
#define ONEHOP_MAPS_H

#include "common.h"

#define MAX_ENDPOINTS 4096 /* this host's VMs */
#define MAX_VIFS 4096

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_ENDPOINTS);
	__type(key, __be32);
	__type(value, struct endpoint);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} endpoints SEC(".maps");

/* The agent may size it at load (--mapping-table-size). */
#define MAX_MAPPINGS 16384

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MAX_MAPPINGS);
	__type(key, __be32);
	__type(value, struct mapping);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} mappings SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 256);
	__type(key, __u32);
	__type(value, struct farm_config);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} farms SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_VIFS);
	__type(key, __u32);
	__type(value, struct vif_info);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} vifs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct node_config);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, struct vis_key);
	__type(value, __u8);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} visibility SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_VIFS);
	__type(key, __be32);
	__type(value, struct fw_policy);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} firewalls SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_VIFS * FW_MAX_RULES * 2);
	__type(key, struct fw_key);
	__type(value, struct fw_rule);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} firewall_rules SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, struct scope_key);
	__type(value, struct scope_members);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} scopes SEC(".maps");

/* LRU: under pressure the oldest flows are forgotten, never new ones refused. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct ct_key);
	__type(value, struct ct_entry);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} conntrack SEC(".maps");

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

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} slowpath SEC(".maps");

static __always_inline struct node_config *node_config(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&config, &zero);
}

static __always_inline void count_forward(__u32 path)
{
	__u64 *n = bpf_map_lookup_elem(&forwards, &path);
	if (n)
		*n += 1;
}

#endif
