/* VNAT connection translation (paper §3.2, §5.2) for tc on an endpoint's
 * interface. The paper's four netfilter hooks collapse into two here:
 * tcx egress does LOCAL_OUT's DNAT and POSTROUTING's SNAT, tcx ingress
 * PREROUTING's DNAT and LOCAL_IN's SNAT. Egress runs after routing, so a
 * moved remote end must already be routable under its virtual address:
 * internal/vnat installs a /32 route for it via the physical address's
 * next hop (docs/connection-migration.md). */
#ifndef ONEHOP_VNAT_H
#define ONEHOP_VNAT_H

#include <linux/in.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include "common.h"
#include "vnat_maps.h"

#define VNAT_IP_MF 0x2000
#define VNAT_IP_OFFSET 0x1fff

/* Rewrites a 4-byte address at off, fixing the IP header checksum and the
 * L4 checksum's pseudo header. BPF_F_PSEUDO_HDR makes the kernel handle a
 * CHECKSUM_PARTIAL skb (locally generated TCP/UDP on egress), whose L4
 * field holds only the pseudo-header sum, as well as a complete checksum. */
static __always_inline int vnat_set_addr(struct __sk_buff *skb, __u32 off,
					 __u32 l3_csum_off, __u32 l4_csum_off,
					 __u64 l4_flags, __be32 from, __be32 to)
{
	if (bpf_l4_csum_replace(skb, l4_csum_off, from, to,
				l4_flags | BPF_F_PSEUDO_HDR | sizeof(to)) < 0)
		return -1;
	if (bpf_l3_csum_replace(skb, l3_csum_off, from, to, sizeof(to)) < 0)
		return -1;
	return bpf_skb_store_bytes(skb, off, &to, sizeof(to), 0);
}

/* Rewrites a port at off and the L4 checksum (ports are outside the
 * pseudo header: under CHECKSUM_PARTIAL the kernel leaves the field be,
 * and the device's sum covers the new port). */
static __always_inline int vnat_set_port(struct __sk_buff *skb, __u32 off,
					 __u32 l4_csum_off, __u64 l4_flags,
					 __be16 from, __be16 to)
{
	if (bpf_l4_csum_replace(skb, l4_csum_off, from, to,
				l4_flags | sizeof(to)) < 0)
		return -1;
	return bpf_skb_store_bytes(skb, off, &to, sizeof(to), 0);
}

/* vnat_translate looks the packet up under dir and, for a migrated
 * connection, rewrites it in place. Every other packet leaves unchanged:
 * not IPv4, a fragment, not TCP/UDP, not in the table. The caller has
 * checked that something is migrated (vnat_state). */
static __always_inline void vnat_translate(struct __sk_buff *skb, __u8 dir)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = data + sizeof(*eth);

	if ((void *)(ip + 1) > end)
		return;
	if (eth->h_proto != bpf_htons(ETH_P_IP) || ip->version != 4 || ip->ihl < 5)
		return;
	if (ip->protocol != IPPROTO_TCP && ip->protocol != IPPROTO_UDP)
		return;
	if (ip->frag_off & bpf_htons(VNAT_IP_MF | VNAT_IP_OFFSET)) {
		/* A fragment's ports are in the first one only; rather than
		 * translate half a datagram, leave every fragment as it is
		 * (TCP sets DF; docs say so for UDP). */
		vnat_count(VNAT_FRAGMENTS_SKIPPED);
		return;
	}

	__u32 l4_off = sizeof(*eth) + ip->ihl * 4;
	__be16 *ports = data + l4_off;

	if ((void *)(ports + 2) > end)
		return;

	struct vnat_tuple key = {
		.saddr = ip->saddr,
		.daddr = ip->daddr,
		.sport = ports[0],
		.dport = ports[1],
		.proto = ip->protocol,
		.dir = dir,
	};
	struct vnat_rewrite *rw = bpf_map_lookup_elem(&vnat_xlate, &key);

	if (!rw)
		return;

	__u32 l3_csum_off = sizeof(*eth) + offsetof(struct iphdr, check);
	__u32 l4_csum_off;
	__u64 l4_flags = 0;

	if (key.proto == IPPROTO_TCP) {
		l4_csum_off = l4_off + offsetof(struct tcphdr, check);
	} else {
		l4_csum_off = l4_off + offsetof(struct udphdr, check);
		/* UDP's 0 means "no checksum": keep it 0, and write 0xffff
		 * for a sum that comes out 0 (RFC 768). */
		l4_flags = BPF_F_MARK_MANGLED_0;
	}
	/* The rewrite is copied out first: the helpers below may move the
	 * packet, and rw points into a map value that Go may update. */
	struct vnat_rewrite to = *rw;
	__u32 saddr_off = sizeof(*eth) + offsetof(struct iphdr, saddr);
	__u32 daddr_off = sizeof(*eth) + offsetof(struct iphdr, daddr);
	int err = 0;

	if (to.saddr != key.saddr)
		err |= vnat_set_addr(skb, saddr_off, l3_csum_off, l4_csum_off,
				     l4_flags, key.saddr, to.saddr);
	if (!err && to.daddr != key.daddr)
		err |= vnat_set_addr(skb, daddr_off, l3_csum_off, l4_csum_off,
				     l4_flags, key.daddr, to.daddr);
	if (!err && to.sport != key.sport)
		err |= vnat_set_port(skb, l4_off, l4_csum_off, l4_flags,
				     key.sport, to.sport);
	if (!err && to.dport != key.dport)
		err |= vnat_set_port(skb, l4_off + 2, l4_csum_off, l4_flags,
				     key.dport, to.dport);
	if (err) {
		vnat_count(VNAT_TRANSLATE_ERRORS);
		return;
	}
	vnat_count(dir == VNAT_EGRESS ? VNAT_EGRESS_TRANSLATED : VNAT_INGRESS_TRANSLATED);
}

#endif
