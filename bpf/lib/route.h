/* Addressing rules shared with the Go allocator (internal/ipam): VMs are
 * 10.f.s.h in a /24 per subnet, the subnet's virtual gateway is 10.f.s.1, and
 * every virtual MAC is 02:00 followed by the four bytes of the IPv4 address.
 * Deriving the MAC from the address lets a receiving host rebuild the source
 * MAC of any VM without the paper's "backward ARP". */
#ifndef ONEHOP_ROUTE_H
#define ONEHOP_ROUTE_H

#include "common.h"

#define SUBNET_MASK_BE bpf_htonl(0xffffff00)

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

static __always_inline int in_vm_space(const struct node_config *cfg, __be32 ip)
{
	return (ip & cfg->vm_mask) == cfg->vm_net;
}

#endif
