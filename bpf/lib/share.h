/* Each VM's share of what every tenant on a host shares (issue: one VM
 * cannot starve the others): new conntrack entries, mapping-table
 * placeholders for addresses being asked about, and frames handed to the
 * agent (DHCP, held packets). A VM over its share is refused and counted,
 * per VM; the others never notice it.
 *
 * Each share is a GCRA token bucket in one u64: the theoretical arrival time
 * of the VM's next unit. A unit is allowed while that time is at most
 * `burst` ahead of now, and moves it on by one interval. Only the rare
 * events above take a lookup here; an admitted flow's packets never do. The
 * agent sizes the shares (share_config) from each table's capacity and the
 * number of local VMs; an interval of 0 means unlimited. */
#ifndef ONEHOP_SHARE_H
#define ONEHOP_SHARE_H

#include "common.h"
#include "share_maps.h"
#include "trace.h"

/* One GCRA step on the bucket *next (the theoretical arrival time of the
 * next unit): 1 when a unit is allowed now, which moves *next on by one
 * interval; 0 when *next is more than burst ahead of now. Racy across
 * CPUs: a bound, not an exact count. Shared with the TAP's copy rate
 * (tap.h). */
static __always_inline int gcra_take(__u64 *next_ns, __u64 interval, __u64 burst, __u64 now)
{
	__u64 next = *next_ns;
	if (next < now)
		next = now;
	if (next - now > burst)
		return 0;
	*next_ns = next + interval;
	return 1;
}

/* Takes one unit of vm's share of kind at now (the packet's one clock
 * read, packet_now): 1 when allowed, 0 when refused. Inlined with kind a
 * constant at every call, so each array index is a fixed offset the
 * verifier can check. */
static __always_inline int share_take(__be32 vm, const __u32 kind, __u64 now)
{
	__u32 zero = 0;
	struct share_limits *cfg = bpf_map_lookup_elem(&share_config, &zero);
	if (!cfg)
		return 1;
	__u64 interval = cfg->interval_ns[kind];
	if (!interval)
		return 1;
	struct vm_share *s = bpf_map_lookup_elem(&vm_shares, &vm);
	if (trace_mode) { /* the same answer, on a copy of the bucket */
		__u64 next = s ? s->next_ns[kind] : 0;
		return gcra_take(&next, interval, cfg->burst_ns[kind], now);
	}
	if (!s) {
		struct vm_share fresh = {};
		fresh.next_ns[kind] = now + interval;
		bpf_map_update_elem(&vm_shares, &vm, &fresh, BPF_NOEXIST);
		return 1;
	}
	if (!gcra_take(&s->next_ns[kind], interval, cfg->burst_ns[kind], now)) {
		__sync_fetch_and_add(&s->refused[kind], 1);
		return 0;
	}
	return 1;
}

#endif
