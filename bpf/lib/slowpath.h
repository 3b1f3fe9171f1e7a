/* What the kernel cannot answer goes to the agent: a VM's DHCP request is
 * copied into a ring buffer and consumed here, so it never reaches the fabric
 * and costs the rest of the traffic nothing (no packet socket taps the vif). */
#ifndef ONEHOP_SLOWPATH_H
#define ONEHOP_SLOWPATH_H

#include "drop.h"
#include "policy.h"

#define DHCP_SERVER_PORT 67
#define DHCP_CLIENT_PORT 68

/* The UDP ports of an unfragmented datagram; 0 when it is none. */
static __always_inline int udp_ports(const struct packet *pkt, __be16 *sport, __be16 *dport)
{
	struct iphdr *ip = pkt->ip;
	if (!ip || ip->protocol != IPPROTO_UDP_ || (ip->frag_off & bpf_htons(IP_OFFSET_MASK)))
		return 0;
	__be16 *udp = (void *)ip + (ip->ihl & 0xf) * 4;
	if ((void *)(udp + 4) > pkt->data_end)
		return 0;
	*sport = udp[0];
	*dport = udp[1];
	return 1;
}

#define BOOTREQUEST 1
#define BOOTP_GIADDR_OFF 24

enum dhcp_class {
	DHCP_NONE = 0, /* not DHCP: no port 67 or 68 involved */
	DHCP_CLIENT,   /* a client's request to a server: the agent answers it */
	DHCP_ROGUE,    /* anything else on DHCP's ports: a VM playing server or relay */
};

/* What a VM's UDP on DHCP's ports is. A VM is only ever a DHCP client:
 * from port 68 to port 67, a BOOTREQUEST, relayed by nobody (giaddr 0).
 * Anything else from port 67, or to port 67 or 68, is a server's or a
 * relay's message (a reply 68 -> 68 inside a subnet included). */
static __always_inline int dhcp_class(const struct packet *pkt)
{
	__be16 sport, dport;
	if (!udp_ports(pkt, &sport, &dport))
		return DHCP_NONE;
	int to_server = dport == bpf_htons(DHCP_SERVER_PORT);
	if (sport != bpf_htons(DHCP_SERVER_PORT) && !to_server && dport != bpf_htons(DHCP_CLIENT_PORT))
		return DHCP_NONE;
	if (!to_server || sport != bpf_htons(DHCP_CLIENT_PORT))
		return DHCP_ROGUE;
	struct iphdr *ip = pkt->ip;
	__u8 *bootp = (void *)ip + (ip->ihl & 0xf) * 4 + 8;
	if ((void *)(bootp + BOOTP_GIADDR_OFF + 4) > pkt->data_end)
		return DHCP_ROGUE;
	__u8 *gi = bootp + BOOTP_GIADDR_OFF;
	if (bootp[0] != BOOTREQUEST || (gi[0] | gi[1] | gi[2] | gi[3]))
		return DHCP_ROGUE;
	return DHCP_CLIENT;
}

/* Hands the frame, as it is now, to the agent; the datapath is done with it. */
static __always_inline int punt_to_agent(struct __sk_buff *skb, struct packet *pkt, __u32 kind)
{
	if (trace_mode) {
		struct trace_record *t = trace_rec();
		if (t)
			t->slow = kind + 1;
		count_forward(kind == SLOW_HOLD ? FWD_HELD : FWD_TO_AGENT);
		return TC_ACT_SHOT;
	}
	struct slowpath_event *ev = bpf_ringbuf_reserve(&slowpath, sizeof(*ev), 0);
	if (!ev)
		return drop_packet(skb, pkt, DROP_AGENT_BUSY);
	__u32 len = skb->len;
	if (len > SLOWPATH_MAX)
		len = SLOWPATH_MAX;
	if (len < ETH_HLEN || bpf_skb_load_bytes(skb, 0, ev->data, len) < 0) {
		bpf_ringbuf_discard(ev, 0);
		return drop_packet(skb, pkt, DROP_MALFORMED);
	}
	ev->kind = kind;
	ev->ifindex = skb->ifindex;
	ev->len = len;
	ev->orig_len = skb->len;
	bpf_ringbuf_submit(ev, 0);
	count_forward(kind == SLOW_HOLD ? FWD_HELD : FWD_TO_AGENT);
	return TC_ACT_SHOT; /* consumed: the agent takes it from here */
}

#endif
