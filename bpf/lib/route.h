/* Addressing rules shared with the Go allocator (internal/ipam) and the
 * cloud's address plan (internal/addrplan): a VM's address is the plan's
 * prefix, then farm, subnet and host bits (10.f.s.h, 8/8/8, by default); a
 * subnet's virtual gateway is host 1, and every virtual MAC is 02:00
 * followed by the four bytes of the IPv4 address. Deriving the MAC from the
 * address lets a receiving host rebuild the source MAC of any VM without
 * the paper's "backward ARP". */
#ifndef ONEHOP_ROUTE_H
#define ONEHOP_ROUTE_H

#include "common.h"

/* The plan's split, set by the loader before the object is loaded (a
 * plan never changes once the cloud holds anything): constants to the
 * verifier, with no lookup per packet. The prefix itself is node_config's
 * vm_net/vm_mask (in_vm_space). */
volatile const __u32 plan_farm_bits = 8;
volatile const __u32 plan_subnet_bits = 8;
volatile const __u32 plan_vm_bits = 8;

/* Host order: the host bits of a subnet's addresses. */
static __always_inline __u32 plan_host_mask(void)
{
	return (1U << plan_vm_bits) - 1;
}

/* Host order: the farm, subnet and host bits (all but the prefix). */
static __always_inline __u32 plan_id_mask(void)
{
	return (1U << (plan_farm_bits + plan_subnet_bits + plan_vm_bits)) - 1;
}

#define SUBNET_MASK_BE bpf_htonl(~plan_host_mask())

static __always_inline __u16 farm_of(__be32 ip)
{
	return (bpf_ntohl(ip) >> (plan_subnet_bits + plan_vm_bits)) & ((1U << plan_farm_bits) - 1);
}

static __always_inline __u16 subnet_of(__be32 ip)
{
	return (bpf_ntohl(ip) >> plan_vm_bits) & ((1U << plan_subnet_bits) - 1);
}

static __always_inline __u32 host_of(__be32 ip)
{
	return bpf_ntohl(ip) & plan_host_mask();
}

/* Whether ip is its subnet's broadcast address (every host bit set). */
static __always_inline int is_subnet_broadcast(__be32 ip)
{
	return host_of(ip) == plan_host_mask();
}

static __always_inline void virtual_mac(__be32 ip, __u8 *mac)
{
	const __u8 *b = (const __u8 *)&ip;
	mac[0] = 0x02;
	mac[1] = 0x00;
	mac[2] = b[0];
	mac[3] = b[1];
	mac[4] = b[2];
	mac[5] = b[3];
}

static __always_inline int same_subnet(__be32 a, __be32 b)
{
	return (a & SUBNET_MASK_BE) == (b & SUBNET_MASK_BE);
}

static __always_inline __be32 gateway_of(__be32 ip)
{
	return (ip & SUBNET_MASK_BE) | bpf_htonl(1);
}

/* The one test of "inside the tenant space" (the plan's prefix). */
static __always_inline int in_vm_space(const struct node_config *cfg, __be32 ip)
{
	return (ip & cfg->vm_mask) == cfg->vm_net;
}

#endif
