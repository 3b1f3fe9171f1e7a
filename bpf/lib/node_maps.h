/* The node's own configuration: one slot the agent writes and every program
 * reads first. It carries the feature bits that gate each feature's stage
 * and the policy epoch whose low bit picks the rule generation in force. */
#ifndef ONEHOP_NODE_MAPS_H
#define ONEHOP_NODE_MAPS_H

#include "common.h"

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct node_config);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} config SEC(".maps");

static __always_inline struct node_config *node_config(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&config, &zero);
}

#endif
