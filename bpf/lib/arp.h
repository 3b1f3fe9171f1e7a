/* The ARP engine's datapath half (paper §2, "Virtual ARP handling"). A VM's
 * ARP for its gateway, for a VM of this host or for a VM the mapping table
 * knows is answered on its host; a miss goes to the fabric as ARP to the
 * Ethernet multicast address of the target's farm and subnet, where the host
 * that holds the VM answers it. ARP for another subnet is refused, or
 * answered with the gateway's MAC when the farm asks for proxy ARP. */
#ifndef ONEHOP_ARP_H
#define ONEHOP_ARP_H

#include "maps.h"
#include "parse.h"
#include "route.h"
#include "mapping.h"
#include "broadcast.h"
#include "slowpath.h"
#include "redirect.h"
#include "fabric_trust.h"

static __always_inline int farm_has(__be32 ip, __u32 flag)
{
	__u32 farm = farm_of(ip);
	struct farm_config *f = bpf_map_lookup_elem(&farms, &farm);
	return f && (f->flags & flag);
}

/* Rewrites the request into a reply from (target, target_mac) to the asker. */
static __always_inline void arp_reply_in_place(struct packet *pkt, __be32 target, const __u8 *target_mac,
					       const __u8 *from_mac)
{
	struct arp_ipv4 *arp = pkt->arp;
	mac_copy(pkt->eth->h_dest, pkt->eth->h_source);
	mac_copy(pkt->eth->h_source, from_mac);
	arp->op = bpf_htons(ARPOP_REPLY);
	mac_copy(arp->tha, arp->sha);
	arp->tpa = arp->spa;
	mac_copy(arp->sha, target_mac);
	arp->spa = target;
}

/* Handles a VM's ARP (anti-spoofing already passed): returns why it is
 * dropped, or DROP_NONE with the frame rewritten in place, either into the
 * reply for the VM or, when *to_fabric is set, into the question for the
 * fabric. */
static __always_inline int handle_vm_arp(struct packet *pkt, const struct node_config *cfg, int *to_fabric)
{
	struct arp_ipv4 *arp = pkt->arp;
	__u8 target_mac[ETH_ALEN];
	__be32 target = arp->tpa;

	if (arp->op != bpf_htons(ARPOP_REQUEST))
		return (DROP_ARP_NOT_REQUEST);
	if (!same_subnet(arp->spa, target)) {
		if (!cfg || !in_vm_space(cfg, target) || !farm_has(arp->spa, FARM_PROXY_ARP))
			return (DROP_ARP_OTHER_SUBNET);
		/* Proxy ARP: the gateway takes it; routing decides the rest. */
		virtual_mac(gateway_of(arp->spa), target_mac);
		arp_reply_in_place(pkt, target, target_mac, target_mac);
		return DROP_NONE;
	}
	if (target == gateway_of(arp->spa)) {
		virtual_mac(target, target_mac);
		arp_reply_in_place(pkt, target, target_mac, target_mac);
		return DROP_NONE;
	}
	struct endpoint *local = bpf_map_lookup_elem(&endpoints, &target);
	if (local) {
		mac_copy(target_mac, local->mac);
		arp_reply_in_place(pkt, target, target_mac, target_mac);
		return DROP_NONE;
	}
	if (mapping_for_send(target, packet_now(pkt))) {
		virtual_mac(target, target_mac);
		arp_reply_in_place(pkt, target, target_mac, target_mac);
		return DROP_NONE;
	}
	if (!cfg || !cfg->uplink_ifindex)
		return (DROP_NO_UPLINK);
	if (!may_ask_fabric(target, arp->spa, packet_now(pkt)))
		return (DROP_ARP_UNKNOWN_TARGET);
	/* The question goes to the hosts of the target's subnet only; the
	 * asker's own addresses stay in it so the answer can find its way back. */
	struct scope_key scope = {.farm = farm_of(target), .subnet = subnet_of(target)};
	scope_mac(&scope, pkt->eth->h_dest);
	mac_copy(pkt->eth->h_source, cfg->uplink_mac);
	*to_fabric = 1;
	return DROP_NONE;
}

static __always_inline int is_broadcast_mac(const __u8 *m)
{
	return (m[0] & m[1] & m[2] & m[3] & m[4] & m[5]) == 0xff;
}

/* The ARP engine on the fabric side, for ARP about VM addresses (the hosts'
 * own ARP goes to their stacks untouched): answers known hosts' questions
 * for this host's VMs, learns the answers to its own questions, and hands
 * a VM the answer it asked for. Only known hosts are heard; a question
 * never makes or moves an entry, and an answer or announcement that would
 * move one (a VM moved, says another host) goes to the agent, which checks
 * the store (fabric_trust.h). */
static __always_inline int handle_fabric_arp(struct __sk_buff *skb, struct packet *pkt,
					     const struct node_config *cfg)
{
	struct arp_ipv4 *arp = pkt->arp;
	__u8 *to = pkt->eth->h_dest;
	__u8 *from = pkt->eth->h_source;
	__be32 spa = arp->spa, tpa = arp->tpa;

	if (arp->op == bpf_htons(ARPOP_REQUEST)) {
		if (!is_scope_mac(to) && !mac_equal(to, cfg->uplink_mac))
			return TC_ACT_OK; /* not the ARP engine's: the stack ignores it */
		struct endpoint *ep = bpf_map_lookup_elem(&endpoints, &tpa);
		if (!ep)
			return drop_quietly(DROP_ARP_NOT_HERE);
		if (!is_known_host(from))
			return drop_packet(skb, pkt, DROP_FABRIC_UNKNOWN_HOST);
		if (is_tenant_source(cfg, spa)) {
			if (bpf_map_lookup_elem(&endpoints, &spa))
				return drop_packet(skb, pkt, DROP_FABRIC_ARP_CONFLICT);
			/* A question teaches nothing: its sender address is only what
			 * the asker says, and a node using a host's MAC would point a VM
			 * of another host at itself. It confirms an entry that agrees
			 * and doubts one that disagrees (the sweep then asks); entries
			 * come from answers to this host's questions, moves from claims
			 * the store backs. The asker's traffic, when it comes, is
			 * checked as any (fabric_sender). */
			struct mapping *m = bpf_map_lookup_elem(&mappings, &spa);
			if (m && !mac_is_zero(m->host_mac)) {
				if (mac_equal(m->host_mac, from))
					m->confirmed_ns = packet_now(pkt);
				else
					mapping_doubted(m);
			}
		}
		__u8 vm_mac[ETH_ALEN];
		mac_copy(vm_mac, ep->mac);
		/* Sender hardware address: the VM's (derived from its IP anyway);
		 * the frame's source MAC tells the asker which host holds it. */
		arp_reply_in_place(pkt, tpa, vm_mac, cfg->uplink_mac);
		count_forward(FWD_ARP_ANSWERED);
		return redirect_out(cfg->uplink_ifindex);
	}
	if (arp->op != bpf_htons(ARPOP_REPLY))
		return drop_packet(skb, pkt, DROP_ARP_NOT_REQUEST);
	if (!in_vm_space(cfg, spa))
		return TC_ACT_OK;
	int announcement = is_broadcast_mac(to) || is_scope_mac(to);
	if (!announcement && !mac_equal(to, cfg->uplink_mac))
		return TC_ACT_OK; /* flooded towards another host */
	if (bpf_map_lookup_elem(&endpoints, &spa))
		return drop_packet(skb, pkt, DROP_FABRIC_ARP_CONFLICT);
	if (!is_known_host(from))
		return drop_packet(skb, pkt, DROP_FABRIC_UNKNOWN_HOST);
	struct mapping *m = bpf_map_lookup_elem(&mappings, &spa);
	if (announcement) {
		/* A VM arrived on the sending host: it concerns only an entry
		 * this host uses, and never adds one, so announcements cannot
		 * fill the table. */
		if (!m || mac_is_zero(m->host_mac))
			return drop_quietly(DROP_ARP_NOT_HERE); /* routine: not a VM this host talks to */
		if (!mac_equal(m->host_mac, from))
			return claim_to_agent(skb, pkt, spa);
		learn_mapping(spa, from, packet_now(pkt));
		count_forward(FWD_ARP_LEARNED);
		return TC_ACT_SHOT;
	}
	/* An answer: this host (a VM of it, or the agent) asked, so an entry is
	 * there, being asked for or being refreshed. */
	if (!m)
		return drop_packet(skb, pkt, DROP_ARP_UNSOLICITED);
	if (!mac_is_zero(m->host_mac) && !mac_equal(m->host_mac, from))
		return claim_to_agent(skb, pkt, spa);
	struct endpoint *asker = bpf_map_lookup_elem(&endpoints, &tpa);
	/* A VM asks only about its own subnet: an answer about another is
	 * not the one it waits for. */
	if (asker && !same_subnet(spa, tpa))
		return drop_packet(skb, pkt, DROP_ARP_OTHER_SUBNET);
	learn_mapping(spa, from, packet_now(pkt));
	count_forward(FWD_ARP_LEARNED);
	if (!asker)
		return punt_to_agent(skb, pkt, SLOW_ARP_REPLY); /* the agent's own question */
	/* The answer a VM's ARP was waiting for, as if its subnet had given it. */
	mac_copy(to, asker->mac);
	virtual_mac(spa, pkt->eth->h_source);
	mac_copy(arp->tha, asker->mac);
	count_forward(FWD_ARP_REPLY);
	return deliver_to_vif(skb, asker->ifindex, asker->kind, 0);
}

#endif
