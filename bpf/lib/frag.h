/* Fragments of admitted flows. Only an IPv4 datagram's first fragment
 * carries its ports, so rules and firewalls can judge only that one; the
 * later fragments are admitted by the datagram their first fragment opened
 * here, never by guessing ports: admitting the first fragment records
 * (source, destination, IP id, protocol) in `frag_flows` for a short
 * while, and a later fragment passes only if its datagram is there. Every
 * host that admits the first fragment (the sender's and the receiver's)
 * keeps its own record, so each decides on its own. The state is bounded
 * twice: an LRU of fixed size and a lifetime far shorter than the IP id
 * takes to wrap. A later fragment that overtakes its first one is dropped
 * (the datagram is lost, as on a path that reorders into a firewall). */
#ifndef ONEHOP_FRAG_H
#define ONEHOP_FRAG_H

#include "common.h"
#include "parse.h"
#include "route.h"
#include "policy.h"
#include "frag_maps.h"

/* admit (policy.h), for fragments too. An unfragmented packet costs one
 * test more than admit itself. */
static __always_inline int admit_fragments(struct packet *pkt, int fw_src, int fw_dst, __u32 epoch, __be32 owner)
{
	struct iphdr *ip = pkt->ip;
	if (!(ip->frag_off & bpf_htons(IP_MF | IP_OFFSET_MASK)) ||
	    (same_subnet(ip->saddr, ip->daddr) && !fw_src && !fw_dst))
		return admit(pkt, fw_src, fw_dst, epoch, owner);

	struct frag_key k = {.saddr = ip->saddr, .daddr = ip->daddr, .id = ip->id, .proto = ip->protocol};
	__u64 now = packet_now(pkt);
	if (ip->frag_off & bpf_htons(IP_OFFSET_MASK)) {
		__u64 *seen = bpf_map_lookup_elem(&frag_flows, &k);
		if (seen && now - *seen < FRAG_LIFETIME_NS)
			return DROP_NONE;
		return DROP_FRAG_NO_FIRST;
	}
	/* A first fragment too short to hold its ports (RFC 1858's tiny
	 * fragment) would be judged without them and let its datagram's
	 * ports be written by a later fragment: no sender needs that. */
	__u8 p = ip->protocol;
	if ((p == IPPROTO_TCP_ || p == IPPROTO_UDP_ || p == IPPROTO_ICMP_) && !l4_of(pkt).known)
		return DROP_MALFORMED;
	int reason = admit(pkt, fw_src, fw_dst, epoch, owner);
	if (!reason && !trace_mode)
		bpf_map_update_elem(&frag_flows, &k, &now, BPF_ANY);
	return reason;
}

#endif
