/* The per-node mapping table (paper §2, "The VNET ARP engine"): where remote
 * VMs live, learned from the fabric, never pushed in full. The agent ages and
 * refreshes entries; the datapath reads and learns them. */
#ifndef ONEHOP_MAPPING_H
#define ONEHOP_MAPPING_H

#include "maps.h"
#include "parse.h"
#include "share.h"

static __always_inline int mac_is_zero(const __u8 *m)
{
	return !(m[0] | m[1] | m[2] | m[3] | m[4] | m[5]);
}

/* The remote VM's entry for a packet about to be sent with it, or 0. The
 * lookup itself refreshes the LRU; used_ns moves at most once a step, so a
 * busy flow costs a read, not a cache-line write per packet.
 *
 * Every helper here takes now, the packet's one read of the coarse clock
 * (packet_now): each read costs about 6 ns. */
static __always_inline struct mapping *mapping_for_send(__be32 ip, __u64 now)
{
	struct mapping *m = bpf_map_lookup_elem(&mappings, &ip);
	if (!m || mac_is_zero(m->host_mac))
		return 0;
	if (!trace_mode && now - m->used_ns > MAPPING_USE_STEP_NS)
		m->used_ns = now;
	return m;
}

/* Records that host_mac holds ip, as confirmed now: a new entry (or one
 * being asked for), or a confirmation of the host already mapped. Never
 * moves a mapped VM to another host (only the agent does, once the store
 * agrees: fabric_trust.h); returns 1 when host_mac disagrees with the
 * entry, which is then left as it is. A new entry counts as used now, so
 * the agent does not age it out before its first packet. */
static __always_inline int learn_mapping(__be32 ip, const __u8 *host_mac, __u64 now)
{
	struct mapping *m = bpf_map_lookup_elem(&mappings, &ip);
	if (m && !mac_is_zero(m->host_mac)) {
		if (!mac_equal(m->host_mac, host_mac))
			return 1;
		if (trace_mode)
			return 0;
		m->confirmed_ns = now;
		return 0;
	}
	if (trace_mode)
		return 0;
	struct mapping fresh = {.confirmed_ns = now, .used_ns = now};
	mac_copy(fresh.host_mac, host_mac);
	/* Written as a whole new value: a reader on another CPU sees the
	 * question or the answer, never half of each. */
	bpf_map_update_elem(&mappings, &ip, &fresh, BPF_ANY);
	return 0;
}

/* Marks ip's entry unconfirmed, so the agent's next sweep (within a
 * second) asks where the VM is: a host other than the mapped one speaks
 * for it, and the mapped one may be stale (a move whose announcement was
 * lost). The answer is a claim the agent checks against the store. */
static __always_inline void mapping_doubted(struct mapping *m)
{
	if (!trace_mode)
		m->confirmed_ns = 0;
}

/* Whether a VM's ARP for ip may go to the fabric now: once per
 * MAPPING_ASK_INTERVAL_NS per address, so a VM asking in a loop for an
 * address nobody holds cannot flood the scope. */
static __always_inline int may_ask_fabric(__be32 ip, __be32 asker, __u64 now)
{
	struct mapping *m = bpf_map_lookup_elem(&mappings, &ip);
	if (trace_mode)
		return !m || !mac_is_zero(m->host_mac) || now - m->confirmed_ns >= MAPPING_ASK_INTERVAL_NS;
	if (m) {
		if (!mac_is_zero(m->host_mac)) /* learned meanwhile: ask anyway, the reply refreshes it */
			return 1;
		if (now - m->confirmed_ns < MAPPING_ASK_INTERVAL_NS)
			return 0;
		m->confirmed_ns = now;
		return 1;
	}
	/* A placeholder takes a slot of the shared LRU table: out of the
	 * asking VM's share, so it cannot evict the others' mappings. */
	if (!share_take(asker, SHARE_ASKS, now))
		return 0;
	struct mapping asked = {.confirmed_ns = now, .used_ns = now};
	bpf_map_update_elem(&mappings, &ip, &asked, BPF_ANY);
	return 1;
}

/* Whether a packet for unmapped ip may be handed to the agent to hold: up
 * to HOLD_PER_ASK per ask interval and address, so a VM sending to
 * addresses nobody holds cannot flood the agent or the fabric. */
#define HOLD_OVER_SHARE -1

/* Returns 1 when the packet may be held, 0 when the address's hold budget
 * is spent, HOLD_OVER_SHARE when the sender may not open a placeholder. */
static __always_inline int may_hold(__be32 ip, __be32 sender, __u64 now)
{
	struct mapping *m = bpf_map_lookup_elem(&mappings, &ip);
	if (trace_mode) { /* the same answer, nothing asked nor counted */
		struct trace_record *t = trace_rec();
		if (!m || now - m->confirmed_ns >= MAPPING_ASK_INTERVAL_NS) {
			if (t)
				t->ask = 1;
			return !m && !share_take(sender, SHARE_ASKS, now) ? HOLD_OVER_SHARE : 1;
		}
		return !mac_is_zero(m->host_mac) || m->held < HOLD_PER_ASK;
	}
	if (!m) {
		if (!share_take(sender, SHARE_ASKS, now))
			return HOLD_OVER_SHARE;
		struct mapping asked = {.confirmed_ns = now, .used_ns = now, .held = 1};
		bpf_map_update_elem(&mappings, &ip, &asked, BPF_NOEXIST);
		return 1;
	}
	if (!mac_is_zero(m->host_mac))
		return 1; /* learned meanwhile: the agent sends it straight on */
	if (now - m->confirmed_ns >= MAPPING_ASK_INTERVAL_NS) {
		m->confirmed_ns = now;
		m->held = 1;
		return 1;
	}
	if (m->held >= HOLD_PER_ASK)
		return 0;
	m->held++; /* racy across CPUs: a bound, not an exact count */
	return 1;
}

#endif
