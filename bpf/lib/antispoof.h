/* Paper §2 step 1: a VM may only send as itself. Checked on the vif before
 * any lookup, so a forged frame never costs a mapping-table probe. */
#ifndef ONEHOP_ANTISPOOF_H
#define ONEHOP_ANTISPOOF_H

#include "parse.h"

/* Returns DROP_NONE when the frame's source MAC and (for IPv4 and ARP) the
 * sender IPv4 are the VM's own. */
static __always_inline int check_source(const struct packet *pkt, const struct vif_info *vif)
{
	if (!mac_equal(pkt->eth->h_source, vif->mac))
		return DROP_SPOOFED_MAC;
	if (pkt->ip && pkt->ip->saddr != vif->ip)
		return DROP_SPOOFED_IP;
	if (pkt->arp && (pkt->arp->spa != vif->ip || !mac_equal(pkt->arp->sha, vif->mac)))
		return DROP_ARP_SPOOFED;
	return DROP_NONE;
}

#endif
