/* The VNAT location service (docs/vnat-location.md): a VM's VNAT daemon asks
 * the location server (the controller, issue 10) where a moved peer is. A
 * VM reaches nothing outside the tenant space, so the host serves it: one
 * well-known link-local address, VNAT_LOC_ADDR, TCP port 2031, the same in
 * every subnet, is handed to the host's own stack, where the agent's relay
 * listens bound to the VM's vif and forwards the stream to the controller,
 * naming the VM. Only that exact service, unfragmented, from a source the
 * anti-spoofing already checked, and within the VM's punt share: any other
 * packet to the address stays no_route, so a VM reaches the host's stack
 * and the fabric no more than before. */
#ifndef ONEHOP_VNAT_SERVICE_H
#define ONEHOP_VNAT_SERVICE_H

#include "common.h"
#include "parse.h"
#include "policy.h"

#define VNAT_LOC_ADDR 0xa9fe141f /* 169.254.20.31, host order */
#define VNAT_LOC_PORT 2031
#define PACKET_HOST_ 0 /* linux/if_packet.h PACKET_HOST: for this host */

static __always_inline int to_location_service(const struct packet *pkt)
{
	struct iphdr *ip = pkt->ip;
	if (!ip || ip->daddr != bpf_htonl(VNAT_LOC_ADDR) || ip->protocol != IPPROTO_TCP_ ||
	    (ip->frag_off & bpf_htons(IP_OFFSET_MASK | IP_MF)))
		return 0;
	__be16 *tcp = (void *)ip + (ip->ihl & 0xf) * 4;
	if ((void *)(tcp + 2) > pkt->data_end)
		return 0;
	return tcp[1] == bpf_htons(VNAT_LOC_PORT);
}

#endif
