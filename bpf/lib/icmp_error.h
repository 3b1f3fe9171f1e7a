/* ICMP errors (RFC 792): reading the packet one quotes (icmp_quote_of, the
 * one reading the router, port space and its egress check share), and the
 * virtual gateway's own time-exceeded, so traceroute from a VM shows its
 * one hop. That one is built in place from the expired packet: room for a
 * new IPv4 and ICMP header is opened after the Ethernet header, the quoted
 * original (its IPv4 header and first 8 payload bytes) is what follows, and
 * the rest is cut off. */
#ifndef ONEHOP_ICMP_ERROR_H
#define ONEHOP_ICMP_ERROR_H

#include "csum.h"
#include "parse.h"
#include "route.h"

#define ICMP_TIME_EXCEEDED 11
#define ICMP_ERR_MAX_QUOTE 68 /* IPv4 header with options (60) + 8 bytes */

/* ICMP errors a router or host sends about a packet: unreachable, time
 * exceeded, parameter problem. */
static __always_inline int is_icmp_error(__u8 type)
{
	return type == 3 || type == 11 || type == 12;
}

/* The packet an ICMP error quotes (RFC 792: its IPv4 header and the first
 * 8 bytes of its payload). */
struct icmp_quote {
	struct iphdr *ip; /* the quoted IPv4 header */
	__u8 *l4;         /* its L4 header's first 8 bytes: TCP/UDP ports, or an echo's type, code, checksum, id */
	__u32 l4_off;     /* l4's offset in the frame */
};

/* The one reading of an ICMP error's quote, shared by the router's
 * conntrack (policy.h), port space's steering (portspace.h) and its egress
 * check (portspace.c). icmp is the error's ICMP header, icmp_off its offset
 * in the frame (for l4_off; 0 when the caller needs no offsets). Returns 1
 * with q set when the quoted IPv4 header (options allowed) and the 8 bytes
 * after it lie in the frame and are an L4 header: the quoted packet is
 * whole or a first fragment. A later fragment's first 8 bytes are payload,
 * not ports, so nothing may be steered or admitted by them: 0. */
static __always_inline int icmp_quote_of(__u8 *icmp, __u32 icmp_off, void *data_end, struct icmp_quote *q)
{
	struct iphdr *in = (void *)(icmp + 8);
	if ((void *)(in + 1) > data_end || in->ihl < 5)
		return 0;
	if (in->frag_off & bpf_htons(IP_OFFSET_MASK))
		return 0;
	__u32 hl = (in->ihl & 0xf) * 4;
	__u8 *l4 = (void *)in + hl;
	if ((void *)(l4 + 8) > data_end)
		return 0;
	q->ip = in;
	q->l4 = l4;
	q->l4_off = icmp_off + 8 + hl;
	return 1;
}

/* Returns 0 when skb now holds the time-exceeded message for the sender. */
static __always_inline int make_time_exceeded(struct __sk_buff *skb, const __u8 *vm_mac)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct iphdr *orig = data + ETH_HLEN;
	if ((void *)(orig + 1) > data_end)
		return -1;
	__u32 quoted = (orig->ihl & 0xf) * 4 + 8;
	__be32 sender = orig->saddr;

	if (bpf_skb_adjust_room(skb, ICMP_ERR_ROOM, BPF_ADJ_ROOM_MAC, 0))
		return -1;
	__u32 want = ETH_HLEN + ICMP_ERR_ROOM + quoted;
	if (skb->len > want && bpf_skb_change_tail(skb, want, 0))
		return -1;

	data = (void *)(long)skb->data;
	data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = data + ETH_HLEN;
	__u8 *icmp = (void *)(ip + 1);
	if ((void *)(icmp + 8) > data_end)
		return -1;
	__u32 icmp_len = data_end - (void *)icmp;
	if (icmp_len > 8 + ICMP_ERR_MAX_QUOTE || icmp_len % 4)
		return -1; /* a quote cut short by a runt packet: not worth answering */

	mac_copy(eth->h_dest, vm_mac);
	virtual_mac(gateway_of(sender), eth->h_source);
	eth->h_proto = bpf_htons(ETH_P_IP);

	icmp_error_headers(ip, gateway_of(sender), sender, icmp_len, ICMP_TIME_EXCEEDED, 0, 0);
	icmp_error_csum(icmp, data_end, 8 + ICMP_ERR_MAX_QUOTE);
	return 0;
}

#endif
