/* What a frame from the fabric must show before it is believed. The fabric
 * is shared with nodes that are no hosts (slivers, externals), so arriving
 * there proves nothing:
 *  - into tenant space only from a known host: the `hosts` map holds the
 *    uplink MACs of the nodes the store lists (the agent fills it from the
 *    node records), and only with a source address a VM can hold;
 *  - a mapping-table entry is made only from a known host and never moved
 *    by the datapath: a host that says it now holds a VM mapped elsewhere
 *    (an announcement after a move, an answer from another host) is handed
 *    to the agent, which moves the entry only if the store places the VM on
 *    that host (the controller's intent is the one source of truth).
 * An entry with a host MAC was therefore made from a known host, and the
 * agent drops entries whose host leaves the store: a frame whose source
 * matches its entry needs no `hosts` lookup, so established traffic pays
 * nothing for this. */
#ifndef ONEHOP_FABRIC_TRUST_H
#define ONEHOP_FABRIC_TRUST_H

#include "common.h"
#include "parse.h"
#include "route.h"
#include "drop.h"
#include "slowpath.h"
#include "mapping.h"
#include "fabric_trust_maps.h"

static __always_inline int is_known_host(const __u8 *mac)
{
	struct host_key k = {};
	mac_copy(k.mac, mac);
	return bpf_map_lookup_elem(&hosts, &k) != 0;
}

/* An address a VM may send from: in the tenant space, and not a subnet's
 * network (.0), gateway (.1) or broadcast (.255) address, which no VM holds
 * (the gateway's replies are made on the VM's own host, never sent on). */
static __always_inline int is_tenant_source(const struct node_config *cfg, __be32 a)
{
	__u32 h = host_of(a);
	return in_vm_space(cfg, a) && h > 1 && h < plan_host_mask();
}

/* Whether a VM packet from the fabric may be believed: returns why not, or
 * DROP_NONE with *learn set when its source is new to the mapping table
 * (the caller learns it once the packet is admitted, so the reply needs no
 * question). A source VM that lives here, or is mapped to another host, is
 * forged; when a known host disagrees with the entry the entry is doubted,
 * for it may be stale (a move whose announcement was lost). */
static __always_inline int fabric_sender(const struct node_config *cfg, __be32 saddr, const __u8 *host_mac, int *learn,
					 struct packet *pkt)
{
	*learn = 0;
	if (!is_tenant_source(cfg, saddr))
		return DROP_FABRIC_NOT_TENANT;
	if (bpf_map_lookup_elem(&endpoints, &saddr))
		return DROP_FABRIC_UNKNOWN_SRC;
	struct mapping *m = bpf_map_lookup_elem(&mappings, &saddr);
	if (m && !mac_is_zero(m->host_mac)) {
		if (mac_equal(m->host_mac, host_mac)) {
			/* Traffic from the VM through its host confirms the entry as
			 * well as an ARP reply would: a flow in both directions never
			 * needs a refresh question. */
			__u64 now = packet_now(pkt);
			if (!trace_mode && now - m->confirmed_ns > MAPPING_USE_STEP_NS)
				m->confirmed_ns = now;
			return DROP_NONE;
		}
		if (!is_known_host(host_mac))
			return DROP_FABRIC_UNKNOWN_HOST;
		mapping_doubted(m);
		return DROP_FABRIC_UNKNOWN_SRC;
	}
	if (!is_known_host(host_mac))
		return DROP_FABRIC_UNKNOWN_HOST;
	*learn = 1;
	return DROP_NONE;
}

/* Hands the agent a known host's claim that it holds ip, which this host
 * maps elsewhere; at most once a second per address and claiming host (a VM
 * moved twice within a second is claimed by its second host at once). */
static __always_inline int claim_to_agent(struct __sk_buff *skb, struct packet *pkt, __be32 ip)
{
	__u64 now = packet_now(pkt);
	struct claim_seen *last = bpf_map_lookup_elem(&mapping_claims, &ip);
	if (last && now - last->at_ns < CLAIM_INTERVAL_NS && mac_equal(last->host_mac, pkt->eth->h_source))
		return drop_quietly(DROP_CLAIM_LIMITED);
	struct claim_seen seen = {.at_ns = now};
	mac_copy(seen.host_mac, pkt->eth->h_source);
	if (!trace_mode)
		bpf_map_update_elem(&mapping_claims, &ip, &seen, BPF_ANY);
	return punt_to_agent(skb, pkt, SLOW_MAPPING_CLAIM);
}

#endif
