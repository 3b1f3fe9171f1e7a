/* The one way a program drops: count the reason, tell the agent, TC_ACT_SHOT. */
#ifndef ONEHOP_DROP_H
#define ONEHOP_DROP_H

#include "maps.h"
#include "parse.h"
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
	/* Best effort: when the ring is full the counter above still tells. */
	struct drop_event *ev = bpf_ringbuf_reserve(&drop_events, sizeof(*ev), 0);
	if (ev) {
		__builtin_memset(ev, 0, sizeof(*ev));
		ev->reason = reason;
		ev->ifindex = skb->ifindex;
		if (pkt->eth && (void *)(pkt->eth + 1) <= pkt->data_end) {
			mac_copy(ev->smac, pkt->eth->h_source);
			ev->ethertype = pkt->proto;
		}
		if (pkt->ip) {
			ev->saddr = pkt->ip->saddr;
			ev->daddr = pkt->ip->daddr;
		} else if (pkt->arp) {
			ev->saddr = pkt->arp->spa;
			ev->daddr = pkt->arp->tpa;
		}
		bpf_ringbuf_submit(ev, 0);
	}
	return TC_ACT_SHOT;
}

#endif
