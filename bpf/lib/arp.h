/* Local ARP answers (paper §2, "Virtual ARP handling"): a VM's request for an
 * address in its own subnet, or for its gateway, is answered on its host, so
 * no VM ARP ever reaches the fabric. */
#ifndef ONEHOP_ARP_H
#define ONEHOP_ARP_H

#include "maps.h"
#include "parse.h"
#include "route.h"

/* Turns the request in place into the reply from target_mac and returns
 * DROP_NONE, or returns why it cannot be answered. */
static __always_inline int answer_arp(struct packet *pkt)
{
	struct arp_ipv4 *arp = pkt->arp;
	__u8 target_mac[ETH_ALEN];
	__be32 target = arp->tpa;

	if (arp->op != bpf_htons(ARPOP_REQUEST))
		return DROP_ARP_NOT_REQUEST;
	if (!same_subnet(arp->spa, target))
		return DROP_ARP_OTHER_SUBNET;
	if (target == gateway_of(arp->spa)) {
		virtual_mac(target, target_mac);
	} else {
		struct endpoint *ep = bpf_map_lookup_elem(&endpoints, &target);
		if (!ep)
			return DROP_ARP_UNKNOWN_TARGET;
		mac_copy(target_mac, ep->mac);
	}

	mac_copy(pkt->eth->h_dest, pkt->eth->h_source);
	mac_copy(pkt->eth->h_source, target_mac);
	arp->op = bpf_htons(ARPOP_REPLY);
	mac_copy(arp->tha, arp->sha);
	arp->tpa = arp->spa;
	mac_copy(arp->sha, target_mac);
	arp->spa = target;
	return DROP_NONE;
}

#endif
