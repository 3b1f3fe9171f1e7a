/* The keepalive helper (paper §3.3.1.3; issue 10 item 8). While a peer is
 * away (it sent VNAT_SUSP_PRIMARY and left), the stationary end's own TCP
 * would probe it with keepalives, get no answer and reset the connection
 * after TCP_KEEPCNT probes. The daemon marks such a connection in
 * vnat_away; this end's egress then recognises the keepalive probes of a
 * marked connection and answers each one itself, as the peer would: the
 * probe is rewritten in place into the peer's ACK and redirected to this
 * interface's ingress, so it never leaves and the socket sees an answer.
 *
 * A keepalive probe (tcp_xmit_probe_skb; other stacks alike) is a segment
 * with ACK and nothing else of SYN/FIN/RST, 0 or 1 byte of payload, and
 * seq = snd_nxt - 1 (an old sequence number the peer must acknowledge). A
 * pure ACK carries seq = snd_nxt, so snd_nxt tells the two apart; the
 * program reads it from the sending socket (skb->sk, CO-RE on struct
 * tcp_sock). A packet without a TCP socket (BPF_PROG_RUN, a socket already
 * orphaned) falls back to what the program saw of the connection since it
 * was marked: the end of the last segment that left, and the last window
 * that came in.
 *
 * The answer, byte for byte (docs/vnat-datapath.md): the probe's Ethernet
 * addresses swapped; IPv4 with no options, TOS kept, ID 0, DF, TTL 64, the
 * addresses swapped; TCP with the ports swapped, seq = the probe's ack_seq
 * (the socket's rcv_nxt), ack_seq = snd_nxt, ACK only, the window the
 * socket last heard from the peer (snd_wnd >> snd_wscale: unchanged), and,
 * when the probe carried a timestamp option (NOP NOP TS), the same option
 * with TSval = the probe's TSecr (the peer's last TSval, so PAWS passes)
 * and TSecr = the probe's TSval; no payload. Both checksums are complete. */
#ifndef ONEHOP_VNAT_HELPER_H
#define ONEHOP_VNAT_HELPER_H

#include <linux/in.h>
#include <linux/tcp.h>
#include <bpf/bpf_core_read.h>
#include "common.h"
#include "csum.h"
#include "vnat_maps.h"
#include "vnat.h"

/* The fields of the kernel's struct tcp_sock the helper reads, relocated
 * against the running kernel's BTF (CO-RE: the layout is not uapi). */
struct tcp_options_received___vnat {
	__u16 snd_wscale : 4;
} __attribute__((preserve_access_index));

struct tcp_sock___vnat {
	__u32 rcv_nxt;
	__u32 snd_nxt;
	__u32 snd_wnd;
	struct tcp_options_received___vnat rx_opt;
} __attribute__((preserve_access_index));

#define VNAT_TCP_FIN 0x01
#define VNAT_TCP_SYN 0x02
#define VNAT_TCP_RST 0x04
#define VNAT_TCP_ACK 0x10

/* The answer's headers, built on the stack and checksummed there. */
struct vnat_ka_l4 {
	struct tcphdr tcp;
	__u8 opt[12]; /* NOP NOP TS(8, 10) TSval TSecr, when the probe had it */
};

struct vnat_pseudo {
	__be32 saddr;
	__be32 daddr;
	__u8 zero;
	__u8 proto;
	__be16 len;
};

static __always_inline int vnat_seq_after(__u32 a, __u32 b)
{
	return (__s32)(a - b) > 0;
}

/* vnat_keepalive answers a marked connection's keepalive probe. It returns
 * TC_ACT_REDIRECT when it turned the probe into the answer (the caller
 * returns that verdict), 0 for every other packet, left as it was. */
static __always_inline int vnat_keepalive(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = data + sizeof(*eth);
	struct tcphdr *th = (void *)(ip + 1);

	/* Locally generated TCP carries no IP options: ihl 5 only. */
	if ((void *)(th + 1) > end)
		return 0;
	if (eth->h_proto != bpf_htons(ETH_P_IP) || ip->version != 4 || ip->ihl != 5 ||
	    ip->protocol != IPPROTO_TCP || (ip->frag_off & bpf_htons(VNAT_IP_MF | VNAT_IP_OFFSET)))
		return 0;

	struct vnat_conn_key k = {
		.laddr = ip->saddr,
		.raddr = ip->daddr,
		.lport = th->source,
		.rport = th->dest,
		.proto = IPPROTO_TCP,
	};
	struct vnat_helper *h = bpf_map_lookup_elem(&vnat_away, &k);

	if (!h)
		return 0;

	__u8 flags = ((__u8 *)th)[13];
	__u32 doff = th->doff * 4;
	__u32 tot = bpf_ntohs(ip->tot_len);
	__u32 seq = bpf_ntohl(th->seq);

	if (doff < sizeof(*th) || tot < sizeof(*ip) + doff)
		return 0;
	__u32 paylen = tot - sizeof(*ip) - doff;

	/* snd_nxt: the socket's, else the end of what was seen leaving. */
	struct tcp_sock___vnat *tp = NULL;
	struct bpf_sock *sk = skb->sk;
	__u32 nxt = h->snd_nxt, win = h->window;
	int know_nxt = h->seen & VNAT_HELPER_SEEN_NXT;
	int know_win = h->seen & VNAT_HELPER_SEEN_WIN;

	if (sk)
		tp = (struct tcp_sock___vnat *)bpf_skc_to_tcp_sock(sk);
	if (tp) {
		nxt = tp->snd_nxt;
		win = tp->snd_wnd >> BPF_CORE_READ_BITFIELD(tp, rx_opt.snd_wscale);
		if (win > 0xffff)
			win = 0xffff;
		know_nxt = know_win = 1;
	}

	int probe = (flags & VNAT_TCP_ACK) && !(flags & (VNAT_TCP_SYN | VNAT_TCP_FIN | VNAT_TCP_RST)) &&
		    paylen <= 1 && know_nxt && seq == nxt - 1;
	if (!probe) {
		/* Remember where the connection's send sequence is. */
		__u32 e = seq + paylen + !!(flags & VNAT_TCP_SYN) + !!(flags & VNAT_TCP_FIN);

		if (!(h->seen & VNAT_HELPER_SEEN_NXT) || vnat_seq_after(e, h->snd_nxt)) {
			h->snd_nxt = e;
			h->seen |= VNAT_HELPER_SEEN_NXT;
		}
		return 0;
	}
	if (!know_win) {
		/* No window to answer with: an answer would move the
		 * socket's send window to a guess. Let the probe go. */
		vnat_count(VNAT_KEEPALIVES_UNANSWERED);
		return 0;
	}

	/* Options: none, or Linux's aligned timestamp (NOP NOP TS). */
	__u32 tsval = 0, tsecr = 0;
	int ts = 0;

	if (doff == sizeof(*th) + 12) {
		__u8 *o = (void *)(th + 1);

		if ((void *)(o + 12) > end)
			return 0;
		if (o[0] != 1 || o[1] != 1 || o[2] != 8 || o[3] != 10) {
			vnat_count(VNAT_KEEPALIVES_UNANSWERED);
			return 0;
		}
		tsval = *(__u32 *)(o + 4);
		tsecr = *(__u32 *)(o + 8);
		ts = 1;
	} else if (doff != sizeof(*th)) {
		vnat_count(VNAT_KEEPALIVES_UNANSWERED);
		return 0;
	}

	struct ethhdr reth = {};
	struct iphdr rip = {};
	struct vnat_ka_l4 r = {};
	struct vnat_pseudo ph = {};

	__builtin_memcpy(reth.h_dest, eth->h_source, ETH_ALEN);
	__builtin_memcpy(reth.h_source, eth->h_dest, ETH_ALEN);
	reth.h_proto = bpf_htons(ETH_P_IP);

	__u32 l4len = ts ? sizeof(r) : sizeof(r.tcp);

	rip.version = 4;
	rip.ihl = 5;
	rip.tos = ip->tos;
	rip.tot_len = bpf_htons(sizeof(rip) + l4len);
	rip.frag_off = bpf_htons(0x4000); /* DF */
	rip.ttl = 64;
	rip.protocol = IPPROTO_TCP;
	rip.saddr = ip->daddr;
	rip.daddr = ip->saddr;

	r.tcp.source = th->dest;
	r.tcp.dest = th->source;
	r.tcp.seq = th->ack_seq;
	r.tcp.ack_seq = bpf_htonl(nxt);
	r.tcp.doff = l4len / 4;
	r.tcp.ack = 1;
	r.tcp.window = bpf_htons((__u16)win);
	if (ts) {
		r.opt[0] = 1;
		r.opt[1] = 1;
		r.opt[2] = 8;
		r.opt[3] = 10;
		*(__u32 *)(r.opt + 4) = tsecr;
		*(__u32 *)(r.opt + 8) = tsval;
	}

	ph.saddr = rip.saddr;
	ph.daddr = rip.daddr;
	ph.proto = IPPROTO_TCP;
	ph.len = bpf_htons(l4len);

	rip.check = csum_fold(bpf_csum_diff(NULL, 0, (__be32 *)&rip, sizeof(rip), 0));
	__s64 sum = bpf_csum_diff(NULL, 0, (__be32 *)&ph, sizeof(ph), 0);

	if (ts)
		sum = bpf_csum_diff(NULL, 0, (__be32 *)&r, sizeof(r), sum);
	else
		sum = bpf_csum_diff(NULL, 0, (__be32 *)&r, sizeof(r.tcp), sum);
	if (sum < 0)
		goto fail;
	r.tcp.check = csum_fold(sum);

	/* The probe becomes the answer: same skb, new length. */
	__u32 len = sizeof(reth) + sizeof(rip) + l4len;

	if (skb->len != len && bpf_skb_change_tail(skb, len, 0) < 0)
		goto fail;
	if (bpf_skb_store_bytes(skb, 0, &reth, sizeof(reth), 0) < 0 ||
	    bpf_skb_store_bytes(skb, sizeof(reth), &rip, sizeof(rip), 0) < 0)
		goto fail;
	if (ts) {
		if (bpf_skb_store_bytes(skb, sizeof(reth) + sizeof(rip), &r, sizeof(r), 0) < 0)
			goto fail;
	} else if (bpf_skb_store_bytes(skb, sizeof(reth) + sizeof(rip), &r, sizeof(r.tcp), 0) < 0) {
		goto fail;
	}
	__sync_fetch_and_add(&h->answered, 1);
	vnat_count(VNAT_KEEPALIVES_ANSWERED);
	return bpf_redirect(skb->ifindex, BPF_F_INGRESS);
fail:
	/* Half rewritten: the packet must not leave as it is now. */
	vnat_count(VNAT_KEEPALIVE_ERRORS);
	return TC_ACT_SHOT;
}

/* vnat_helper_ingress remembers the window a marked connection's peer
 * last advertised (for answers to probes that come without a socket). */
static __always_inline void vnat_helper_ingress(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = data + sizeof(*eth);
	struct tcphdr *th = (void *)(ip + 1);

	if ((void *)(th + 1) > end)
		return;
	if (eth->h_proto != bpf_htons(ETH_P_IP) || ip->version != 4 || ip->ihl != 5 ||
	    ip->protocol != IPPROTO_TCP || (ip->frag_off & bpf_htons(VNAT_IP_MF | VNAT_IP_OFFSET)))
		return;
	if (th->syn || !th->ack)
		return;

	struct vnat_conn_key k = {
		.laddr = ip->daddr,
		.raddr = ip->saddr,
		.lport = th->dest,
		.rport = th->source,
		.proto = IPPROTO_TCP,
	};
	struct vnat_helper *h = bpf_map_lookup_elem(&vnat_away, &k);

	if (!h)
		return;
	h->window = bpf_ntohs(th->window);
	h->seen |= VNAT_HELPER_SEEN_WIN;
}

#endif
