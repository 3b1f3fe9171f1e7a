/* Port space at the socket (docs/port-space-datapath.md): cgroup sock_addr
 * programs attached at the parent of the slivers' cgroups. A task in a
 * sliver's cgroup (or below it) that binds, or connects from, a port its
 * sliver does not lease gets EPERM: the application sees an error, not
 * silence. Tasks in no sliver cgroup are untouched. The datapath
 * (sliver_ingress) still drops whatever leaves from a foreign port; this
 * only makes the mistake visible where it is made. */
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "lib/portspace_maps.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define PORTSPACE_CGROUP_DEPTH 16

/* The sliver of the calling task: its cgroup's, or an ancestor's (a
 * sliver may make cgroups below its own). 0: no sliver. */
static __always_inline __u32 portspace_task_slot(void)
{
	__u64 id = bpf_get_current_cgroup_id();
	__u32 *slot = bpf_map_lookup_elem(&portspace_cgroups, &id);
	if (slot)
		return *slot;
	for (int level = 1; level < PORTSPACE_CGROUP_DEPTH; level++) {
		id = bpf_get_current_ancestor_cgroup_id(level);
		if (!id)
			return 0;
		slot = bpf_map_lookup_elem(&portspace_cgroups, &id);
		if (slot)
			return *slot;
	}
	return 0;
}

/* May slot use port (host order) on addr? On a public address: if it
 * leases the port on that uplink; on the wildcard: on any uplink it
 * leases it on; anything else (its own loopback) is not the fabric's. */
static __always_inline int portspace_may_use(__u32 slot, __be32 addr, __u16 port)
{
	if (addr == 0) {
		for (__u32 u = 0; u < PORTSPACE_MAX_UPLINKS; u++)
			if (portspace_port_owner(u, port) == slot)
				return 1;
		return 0;
	}
	__u32 *u = bpf_map_lookup_elem(&portspace_addrs, &addr);
	if (!u)
		return 1;
	return portspace_port_owner(*u, port) == slot;
}

/* bind(): a port chosen by the application. Port 0 is the kernel's pick,
 * judged once made (post_bind4). */
SEC("cgroup/bind4")
int sliver_bind4(struct bpf_sock_addr *ctx)
{
	__u32 slot = portspace_task_slot();
	if (!slot)
		return 1;
	__u16 port = bpf_ntohs((__u16)ctx->user_port);
	if (!port)
		return 1;
	return portspace_may_use(slot, ctx->user_ip4, port);
}

/* After bind(): the port the kernel picked for port 0 comes from the
 * sliver's ip_local_port_range, which a sliver's root may change. */
SEC("cgroup/post_bind4")
int sliver_post_bind4(struct bpf_sock *sk)
{
	__u32 slot = portspace_task_slot();
	if (!slot)
		return 1;
	return portspace_may_use(slot, sk->src_ip4, (__u16)sk->src_port);
}

/* connect(): from a port bound earlier (before the task joined the
 * sliver's cgroup, say). An unbound socket is given a port from the
 * sliver's ip_local_port_range after this hook; one outside the lease
 * leaves nothing (sliver_ingress drops and counts it). */
SEC("cgroup/connect4")
int sliver_connect4(struct bpf_sock_addr *ctx)
{
	__u32 slot = portspace_task_slot();
	if (!slot)
		return 1;
	struct bpf_sock *sk = ctx->sk;
	if (!sk)
		return 1;
	__u16 port = (__u16)sk->src_port;
	if (!port)
		return 1;
	return portspace_may_use(slot, sk->src_ip4, port);
}
