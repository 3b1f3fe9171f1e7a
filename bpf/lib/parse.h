/* Bounds-checked header access. Every pointer handed out has been checked
 * against data_end, so the verifier accepts it and a truncated frame is a
 * clean DROP_MALFORMED rather than a read past the packet. */
#ifndef ONEHOP_PARSE_H
#define ONEHOP_PARSE_H

#include "common.h"

#define ARPHRD_ETHER 1
#define ARPOP_REQUEST 1
#define ARPOP_REPLY 2

/* ARP for IPv4 over Ethernet (RFC 826); packed because spa/tpa are not
 * 4-byte aligned on the wire. */
struct arp_ipv4 {
	__be16 htype;
	__be16 ptype;
	__u8 hlen;
	__u8 plen;
	__be16 op;
	__u8 sha[ETH_ALEN];
	__be32 spa;
	__u8 tha[ETH_ALEN];
	__be32 tpa;
} __attribute__((packed));

struct packet {
	void *data;
	void *data_end;
	struct ethhdr *eth;
	struct iphdr *ip;     /* set when proto == ETH_P_IP */
	struct arp_ipv4 *arp; /* set when proto == ETH_P_ARP */
	__u16 proto;          /* host order */
	__u64 now;            /* the coarse clock, once read (packet_now) */
};

#define IPPROTO_ICMP_ 1
#define IPPROTO_TCP_ 6
#define IPPROTO_UDP_ 17
#define IP_OFFSET_MASK 0x1fff
#define IP_MF 0x2000 /* more fragments */
#define ICMP_ECHO_REPLY 0
#define ICMP_ECHO_REQUEST 8

#define ETH_P_8021Q_ 0x8100
#define ETH_P_8021AD_ 0x88a8

/* parse_packet fills pkt and returns DROP_NONE, or the reason the frame cannot
 * be carried. IPv4 options are allowed (ihl > 5) and skipped by callers that
 * need L4; a header shorter than 20 bytes or longer than the frame, or a
 * total length beyond the frame, is malformed. A VLAN tag in the frame is
 * DROP_VLAN_TAGGED (a tag the device took out of the frame is in
 * skb->vlan_present; each program checks that itself). */
static __always_inline int parse_packet(struct __sk_buff *skb, struct packet *pkt)
{
	pkt->data = (void *)(long)skb->data;
	pkt->data_end = (void *)(long)skb->data_end;
	pkt->eth = pkt->data;
	pkt->ip = 0;
	pkt->arp = 0;
	if ((void *)(pkt->eth + 1) > pkt->data_end)
		return DROP_MALFORMED;
	pkt->proto = bpf_ntohs(pkt->eth->h_proto);

	if (pkt->proto == ETH_P_IP) {
		struct iphdr *ip = (void *)(pkt->eth + 1);
		if ((void *)(ip + 1) > pkt->data_end)
			return DROP_MALFORMED;
		if (ip->version != 4 || ip->ihl < 5)
			return DROP_MALFORMED;
		if ((void *)ip + ip->ihl * 4 > pkt->data_end)
			return DROP_MALFORMED;
		__u32 tot_len = bpf_ntohs(ip->tot_len);
		if (tot_len < ip->ihl * 4)
			return DROP_MALFORMED;
		/* skb->len, not data_end: a GSO packet's payload lies beyond the
		 * linear part, and its tot_len covers all of it. Shorter than the
		 * frame is fine (Ethernet pads small frames). */
		if (tot_len + ETH_HLEN > skb->len)
			return DROP_MALFORMED;
		pkt->ip = ip;
		return DROP_NONE;
	}
	if (pkt->proto == ETH_P_ARP) {
		struct arp_ipv4 *arp = (void *)(pkt->eth + 1);
		if ((void *)(arp + 1) > pkt->data_end)
			return DROP_MALFORMED;
		if (arp->htype != bpf_htons(ARPHRD_ETHER) || arp->ptype != bpf_htons(ETH_P_IP) ||
		    arp->hlen != ETH_ALEN || arp->plen != 4)
			return DROP_MALFORMED;
		pkt->arp = arp;
		return DROP_NONE;
	}
	if (pkt->proto == ETH_P_8021Q_ || pkt->proto == ETH_P_8021AD_)
		return DROP_VLAN_TAGGED;
	return DROP_UNSUPPORTED;
}

/* The coarse clock, read once per packet: a helper call costs about 6 ns
 * here, and conntrack, the mapping table, the per-VM shares, the fabric
 * checks, port space and the TAP's copy rate each want the time. Helpers
 * take it as an argument (now) rather than reading the clock again. */
static __always_inline __u64 packet_now(struct packet *pkt)
{
	if (!pkt->now)
		pkt->now = bpf_ktime_get_coarse_ns();
	return pkt->now;
}

static __always_inline int mac_equal(const __u8 *a, const __u8 *b)
{
	return a[0] == b[0] && a[1] == b[1] && a[2] == b[2] && a[3] == b[3] && a[4] == b[4] &&
	       a[5] == b[5];
}

static __always_inline void mac_copy(__u8 *dst, const __u8 *src)
{
	__builtin_memcpy(dst, src, ETH_ALEN);
}

#endif
