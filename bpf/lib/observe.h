/* Datapath events (onehop observe, and the agent's drop log): a record per
 * drop and, while someone observes, per admitted new flow, into the
 * drop_events ring. Each farm publishes out of its own token bucket before
 * it reserves ring space, so one tenant's flood spends its own budget (and
 * is counted as its lost events), never the ring space another tenant's
 * events need. Publishing admitted flows costs one array lookup at a flow's
 * opening while nobody observes, and nothing on a flow's later packets. */
#ifndef ONEHOP_OBSERVE_H
#define ONEHOP_OBSERVE_H

#include "common.h"
#include "counter_maps.h"
#include "observe_maps.h"
#include "conntrack.h"
#include "route.h"

/* The farm of a tenant address, by the cloud's address plan (route.h). */
static __always_inline __u32 farm_of_addr(__be32 ip)
{
	return farm_of(ip);
}

/* Takes one event from farm's budget and reserves its record, or counts it
 * lost. The record is zeroed but for its farm. */
static __always_inline struct observe_event *observe_reserve(__u32 farm)
{
	__u32 zero = 0;
	struct observe_limits *c = bpf_map_lookup_elem(&observe_config, &zero);
	__u64 per = c && c->ns_per_event ? c->ns_per_event : OBSERVE_NS_PER_EVENT;
	__u64 burst = c && c->burst ? c->burst : OBSERVE_BURST;
	/* A plan with more than OBSERVE_FARMS farms folds them onto the slots:
	 * farms a multiple of OBSERVE_FARMS apart share one budget. */
	__u32 key = farm & (OBSERVE_FARMS - 1);
	struct observe_bucket *b = bpf_map_lookup_elem(&observe_budget, &key);
	if (!b)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	__u64 add = (now - b->stamp) / per;
	if (b->tokens + add >= burst) {
		b->tokens = burst;
		b->stamp = now;
	} else if (add) {
		b->tokens += add;
		b->stamp += add * per;
	}
	if (!b->tokens) {
		b->lost++;
		return 0;
	}
	struct observe_event *ev = bpf_ringbuf_reserve(&drop_events, sizeof(*ev), 0);
	if (!ev) {
		b->lost++;
		return 0;
	}
	b->tokens--;
	__builtin_memset(ev, 0, sizeof(*ev));
	ev->farm = farm;
	return ev;
}

/* Waking the agent for each record costs more than the rest of a new
 * flow's path (an irq_work per submit: ~1 us here): records go in quietly
 * and the agent reads the ring at least every agent.ObservePoll (100 ms),
 * unless this much is waiting, when the reader is woken at once. */
#define OBSERVE_WAKEUP_BYTES (32 * 1024)

static __always_inline void observe_submit(struct observe_event *ev)
{
	__u64 flags = bpf_ringbuf_query(&drop_events, BPF_RB_AVAIL_DATA) >= OBSERVE_WAKEUP_BYTES ? BPF_RB_FORCE_WAKEUP
												 : BPF_RB_NO_WAKEUP;
	bpf_ringbuf_submit(ev, flags);
}

/* Publishes a flow just admitted and remembered (policy.h, admit), while
 * someone observes; owner is the local VM whose share the entry took, and
 * whose farm's budget the event spends. Not inlined: admit's stack is
 * near BPF's 512 bytes already. */
static __attribute__((noinline)) int observe_flow(const struct flow *f, __be32 owner)
{
	__u32 zero = 0;
	struct observe_limits *c = bpf_map_lookup_elem(&observe_config, &zero);
	if (!c || !c->flows)
		return 0;
	struct observe_event *ev = observe_reserve(farm_of_addr(owner));
	if (!ev)
		return 0;
	ev->kind = OBSERVE_FLOW;
	ev->saddr = f->saddr;
	ev->daddr = f->daddr;
	ev->sport = f->sport;
	ev->dport = f->dport;
	ev->proto = f->proto;
	ev->ethertype = 0x0800;
	observe_submit(ev);
	return 0;
}

#endif
