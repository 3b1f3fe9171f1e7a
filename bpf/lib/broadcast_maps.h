/* The VMs of each scope on this host, for scoped broadcast and multicast
 * (paper §2): written by the agent (reconciled). A scope is a subnet
 * (subnet != 0) or a whole farm (subnet == 0). Its members are entries of
 * their own, (scope, index) for index < count, so a scope holds as many
 * VMs as the host does: the only limit is the endpoint capacity. */
#ifndef ONEHOP_BROADCAST_MAPS_H
#define ONEHOP_BROADCAST_MAPS_H

#include "common.h"
#include "endpoint_maps.h"

/* Every VM is in two scopes: its subnet's and its farm's. */
#define MAX_SCOPES (2 * MAX_ENDPOINTS)
#define MAX_SCOPE_MEMBERS (2 * MAX_ENDPOINTS)

struct scope_key {
	__u16 farm;
	__u16 subnet;
};

struct scope_info {
	__u32 count; /* members at index 0 .. count-1 */
};

struct member_key {
	__u16 farm;
	__u16 subnet;
	__u32 index;
};

struct scope_member {
	__u32 ifindex;
	__be32 ip;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_SCOPES);
	__type(key, struct scope_key);
	__type(value, struct scope_info);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} scopes SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_SCOPE_MEMBERS);
	__type(key, struct member_key);
	__type(value, struct scope_member);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} scope_members SEC(".maps");

#endif
