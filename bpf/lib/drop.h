/* The one way a program drops: count the reason, tell the agent, TC_ACT_SHOT. */
#ifndef ONEHOP_DROP_H
#define ONEHOP_DROP_H

#include "maps.h"
#include "parse.h"
#include "route.h"
#include "observe.h"
#include "trace.h"

/* Counts a drop that is routine enough not to be worth a log line. */
static __always_inline int drop_quietly(__u32 reason)
{
	if (trace_mode) {
		trace_drop(reason);
		return TC_ACT_SHOT;
	}
	__u64 *n = bpf_map_lookup_elem(&drops, &reason);
	if (n)
		*n += 1;
	return TC_ACT_SHOT;
}

/* The farm whose budget a drop's event spends: the VM's behind the vif it
 * came from (a VM forging another farm's source spends its own), else the
 * source's, when it is a tenant address. */
static __always_inline __u32 drop_farm(__u32 ifindex, __be32 saddr)
{
	struct vif_info *vif = bpf_map_lookup_elem(&vifs, &ifindex);
	if (vif)
		return farm_of_addr(vif->ip);
	struct node_config *cfg = node_config();
	if (cfg && saddr && in_vm_space(cfg, saddr))
		return farm_of_addr(saddr);
	return 0;
}

static __always_inline int drop_packet(struct __sk_buff *skb, struct packet *pkt, __u32 reason)
{
	if (trace_mode) {
		trace_drop(reason);
		return TC_ACT_SHOT;
	}
	__u64 *n = bpf_map_lookup_elem(&drops, &reason);
	if (n)
		*n += 1;

	/* clang may keep &skb->ifindex in a register across calls, a moved ctx
	 * pointer the verifier refuses to dereference: make it read skb anew. */
	asm volatile(""
		     : "+r"(skb));
	__u32 ifindex = skb->ifindex;
	__be32 saddr = 0, daddr = 0;
	if (pkt->ip) {
		saddr = pkt->ip->saddr;
		daddr = pkt->ip->daddr;
	} else if (pkt->arp) {
		saddr = pkt->arp->spa;
		daddr = pkt->arp->tpa;
	}
	/* Best effort: when the farm is over its budget or the ring is full
	 * the counter above still tells, and the farm's lost count. */
	struct observe_event *ev = observe_reserve(drop_farm(ifindex, saddr));
	if (ev) {
		ev->kind = OBSERVE_DROP;
		ev->reason = reason;
		ev->ifindex = ifindex;
		ev->saddr = saddr;
		ev->daddr = daddr;
		if (pkt->eth && (void *)(pkt->eth + 1) <= pkt->data_end) {
			mac_copy(ev->smac, pkt->eth->h_source);
			ev->ethertype = pkt->proto;
		}
		struct iphdr *ip = pkt->ip;
		if (ip && !(ip->frag_off & bpf_htons(IP_OFFSET_MASK)) &&
		    (ip->protocol == IPPROTO_TCP_ || ip->protocol == IPPROTO_UDP_)) {
			__be16 *ports = (void *)ip + (ip->ihl & 0xf) * 4;
			if ((void *)(ports + 2) <= pkt->data_end) {
				ev->sport = ports[0];
				ev->dport = ports[1];
			}
		}
		if (ip)
			ev->proto = ip->protocol;
		observe_submit(ev);
	}
	return TC_ACT_SHOT;
}

#endif
