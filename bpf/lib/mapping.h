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
 * busy flow costs a read, not a cache-line write per packet. */
static __always_inline struct mapping *mapping_for_send(__be32 ip)
{
	struct mapping *m = bpf_map_lookup_elem(&mappings, &ip);
	if (!m || mac_is_zero(m->host_mac))
		return 0;
	__u64 now = bpf_ktime_get_coarse_ns();
	if (now - m->used_ns > MAPPING_USE_STEP_NS)
		m->used_ns = now;
	return m;
}

/* Records that host_mac holds ip, as confirmed now. A new entry counts as
 * used now, so the agent does not age it out before its first packet. */
static __always_inline void learn_mapping(__be32 ip, const __u8 *host_mac)
{
	__u64 now = bpf_ktime_get_coarse_ns();
	struct mapping fresh = {.confirmed_ns = now, .used_ns = now};
	mac_copy(fresh.host_mac, host_mac);
	struct mapping *m = bpf_map_lookup_elem(&mappings, &ip);
	if (m) {
		if (mac_equal(m->host_mac, host_mac)) {
			m->confirmed_ns = now;
			return;
		}
		fresh.used_ns = m->used_ns;
	}
	/* A new host is written as a whole new value: a reader on another
	 * CPU sees the old MAC or the new one, never half of each. */
	bpf_map_update_elem(&mappings, &ip, &fresh, BPF_ANY);
}

/* Whether a VM's ARP for ip may go to the fabric now: once per
 * MAPPING_ASK_INTERVAL_NS per address, so a VM asking in a loop for an
 * address nobody holds cannot flood the scope. */
static __always_inline int may_ask_fabric(__be32 ip, __be32 asker)
{
	__u64 now = bpf_ktime_get_coarse_ns();
	struct mapping *m = bpf_map_lookup_elem(&mappings, &ip);
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
	if (!share_take(asker, SHARE_ASKS))
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
static __always_inline int may_hold(__be32 ip, __be32 sender)
{
	__u64 now = bpf_ktime_get_coarse_ns();
	struct mapping *m = bpf_map_lookup_elem(&mappings, &ip);
	if (!m) {
		if (!share_take(sender, SHARE_ASKS))
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

enum fabric_source {
	SRC_FORGED = 0, /* mapped to another host, or one of this host's VMs */
	SRC_KNOWN,      /* mapped to the sending host */
	SRC_NEW,        /* not mapped: learn it once the packet is admitted */
};

/* Checks the sending host of a VM packet from the fabric against the table.
 * A new source may be learned by the caller once it admitted the packet (the
 * sending host already checked the VM; its replies then need no question). */
static __always_inline int fabric_source(__be32 saddr, const __u8 *host_mac)
{
	if (bpf_map_lookup_elem(&endpoints, &saddr))
		return SRC_FORGED;
	struct mapping *m = bpf_map_lookup_elem(&mappings, &saddr);
	if (!m || mac_is_zero(m->host_mac))
		return SRC_NEW;
	if (!mac_equal(m->host_mac, host_mac)) {
		/* Refused; but if the VM moved and its announcement was lost, the
		 * entry is stale: mark it unconfirmed so the agent's next sweep
		 * (within a second) asks where the VM is. */
		m->confirmed_ns = 0;
		return SRC_FORGED;
	}
	/* Traffic from the VM through its host confirms the entry as well as an
	 * ARP reply would: a flow in both directions never needs a refresh
	 * question. */
	__u64 now = bpf_ktime_get_coarse_ns();
	if (now - m->confirmed_ns > MAPPING_USE_STEP_NS)
		m->confirmed_ns = now;
	return SRC_KNOWN;
}

#endif
