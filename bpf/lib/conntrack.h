/* Connection tracking (conntrack_maps.h): one entry per flow, found by its
 * packets in both directions with one lookup. The key puts the flow's lower
 * endpoint first, so a reply builds the same key as the packet it answers;
 * the entry records which way the flow was opened, so a reply is still only
 * a reply: it passes on the entry because it goes the other way, and a
 * packet going the other way passes only if it may answer (policy.h). */
#ifndef ONEHOP_CONNTRACK_H
#define ONEHOP_CONNTRACK_H

#include "conntrack_maps.h"
#include "trace.h"

/* Idle flows stop letting packets in after this long. */
#define CT_TIMEOUT_NS (300ULL * 1000000000ULL)
/* A flow's last-seen time moves in steps this big: a busy flow costs a
 * read per packet, not a shared cache-line write. */
#define CT_TOUCH_STEP_NS 1000000000ULL

/* A flow as one packet sees it: from its source to its destination. */
struct flow {
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
	__u8 proto;
};

/* Fills the flow's key and returns the packet's direction in it
 * (CT_OPENED_AB when its source is endpoint a). Any total order does, as
 * long as both directions use the same one: raw network-order words. */
static __always_inline __u8 ct_key_of(const struct flow *f, struct ct_key *k)
{
	__builtin_memset(k, 0, sizeof(*k));
	k->proto = f->proto;
	if (f->saddr < f->daddr || (f->saddr == f->daddr && f->sport <= f->dport)) {
		k->addr_a = f->saddr;
		k->addr_b = f->daddr;
		k->port_a = f->sport;
		k->port_b = f->dport;
		return CT_OPENED_AB;
	}
	k->addr_a = f->daddr;
	k->addr_b = f->saddr;
	k->port_a = f->dport;
	k->port_b = f->sport;
	return CT_OPENED_BA;
}

static __always_inline int ct_live(const struct ct_entry *e, __u64 now)
{
	return now - e->last_seen_ns < CT_TIMEOUT_NS;
}

static __always_inline void ct_touch(struct ct_entry *e, __u64 now)
{
	if (!trace_mode && now - e->last_seen_ns > CT_TOUCH_STEP_NS)
		e->last_seen_ns = now;
}

/* Records that a rule in force at epoch opened the flow in direction dir.
 * What the entry already vouched for at the same epoch is kept (a ping each
 * way with the same id is one entry opened both ways); anything older is
 * not, since it was never checked against the rules in force. */
static __always_inline void ct_open(const struct ct_key *k, struct ct_entry *old, __u8 dir, __u32 epoch, __u64 now)
{
	if (trace_mode)
		return;
	struct ct_entry fresh = {.last_seen_ns = now, .epoch = epoch, .opened = dir};
	if (old && old->epoch == epoch && ct_live(old, now) && !(old->opened & CT_CUT))
		fresh.opened |= old->opened;
	bpf_map_update_elem(&conntrack, k, &fresh, BPF_ANY);
}

#endif
