/* LISP encapsulation and decapsulation (RFC 9300 §5) for tcx.
 *
 * An encapsulated packet, as it leaves:
 *
 *   Ethernet (path's MACs) | IPv4 (local RLOC -> remote RLOC, DF, TTL and
 *   TOS of the inner packet, proto 17) | UDP (hash of the inner flow ->
 *   4341, checksum 0) | LISP (N, nonce; I, instance id) | inner IPv4 ...
 *
 * Outer UDP checksum 0: RFC 9300 §5.3 says it SHOULD be zero for IPv4 and
 * an ETR MUST accept zero. The inner packet carries its own checksums, the
 * outer IPv4 header has its own, and a non-zero outer checksum would have
 * to cover the whole inner packet: per packet in software, or, for GSO,
 * SKB_GSO_UDP_TUNNEL_CSUM on every segment. Zero costs nothing.
 *
 * GSO: room is opened with bpf_skb_adjust_room and the ENCAP flags
 * (outer IPv4, UDP, an 8-byte "L2" between UDP and the inner IPv4: the LISP
 * header), which set the inner header offsets and SKB_GSO_UDP_TUNNEL, so a
 * superpacket stays one and the kernel segments it where it must; the
 * helper also lowers gso_size by 36, so each segment keeps the size the
 * sender chose for the inner packet unless the sender already left room
 * (see the MTU check below). */
#ifndef ONEHOP_LISP_H
#define ONEHOP_LISP_H

#include <linux/in.h>
#include <linux/udp.h>
#include "common.h"
#include "csum.h"
#include "parse.h"
#include "lisp_maps.h"

#define LISP_DATA_PORT 4341
#define LISP_OVERHEAD 36 /* outer IPv4 20 + UDP 8 + LISP 8 */

/* The first byte of the LISP header (RFC 9300 §5.3). */
#define LISP_FLAG_N 0x80 /* nonce present */
#define LISP_FLAG_L 0x40 /* locator-status-bits in use */
#define LISP_FLAG_E 0x20 /* echo-nonce request */
#define LISP_FLAG_V 0x10 /* map-version present */
#define LISP_FLAG_I 0x08 /* instance id present */

struct lisp_hdr {
	__u8 flags;
	__u8 nonce[3];  /* or source and destination map-version with V */
	__be32 iid_lsb; /* with I: instance id (24) | LSBs (8); else LSBs (32) */
};

struct lisp_outer {
	struct iphdr ip;
	struct udphdr udp;
	struct lisp_hdr lisp;
};
_Static_assert(sizeof(struct lisp_outer) == 36, "outer headers are 36 bytes, no padding");

/* tcx: let the rest of the chain and the stack have the packet. */
#define LISP_TCX_NEXT -1

#define LISP_IP_MF 0x2000
#define LISP_IP_OFFSET 0x1fff
#define LISP_IP_DF 0x4000

/* Adjust-room flags of kernels after 6.18 (uapi values): decapsulating a
 * UDP tunnel then also clears skb->encapsulation and SKB_GSO_UDP_TUNNEL. */
#define LISP_ADJ_ROOM_DECAP_L4_UDP (1ULL << 10)

/* The inner flow's hash: the outer UDP source port (entropy for ECMP on the
 * underlay, RFC 9300 §5.3) and the pick among equal RLOCs. Deterministic so
 * tests can predict it (internal/lispdp.FlowHash is its twin). */
static __always_inline __u32 lisp_flow_hash(__be32 saddr, __be32 daddr, __u32 ports, __u8 proto)
{
	__u32 h = bpf_ntohl(saddr) * 0x9e3779b1u;

	h ^= bpf_ntohl(daddr) + 0x7f4a7c15u + (h << 6) + (h >> 2);
	h ^= ports + 0x85ebca6bu + (h << 6) + (h >> 2);
	h ^= proto;
	/* murmur3's finaliser: every input bit reaches every output bit */
	h ^= h >> 16;
	h *= 0x85ebca6bu;
	h ^= h >> 13;
	h *= 0xc2b2ae35u;
	h ^= h >> 16;
	return h;
}

/* Ephemeral range (RFC 6335): never 4341/4342, never a well-known port. */
static __always_inline __be16 lisp_src_port(__u32 h)
{
	return bpf_htons(0xc000 | (h & 0x3fff));
}

static __always_inline void lisp_path_count(__u32 id, __u64 packets, __u64 bytes, int tx)
{
	struct lisp_stats *s = bpf_map_lookup_elem(&lisp_path_stats, &id);

	if (!s)
		return;
	if (tx) {
		s->tx_packets += packets;
		s->tx_bytes += bytes;
	} else {
		s->rx_packets += packets;
		s->rx_bytes += bytes;
	}
}

static __always_inline int lisp_drop(__u32 reason)
{
	lisp_count(reason);
	return TC_ACT_SHOT;
}

static __always_inline int lisp_bit(const __u64 *bits, __u32 id)
{
	return (bits[(id >> 6) & 3] >> (id & 63)) & 1;
}

#define LISP_ICMP_MAX_QUOTE 80 /* IPv4 header with options (60) + a TCP header (20) */
#define LISP_ICMP_DEST_UNREACH 3
#define LISP_ICMP_FRAG_NEEDED 4

/* RFC 9300 §7.2, the stateful approach: a packet with DF that would not fit
 * the path once encapsulated is turned, in place, into ICMP "fragmentation
 * needed" (RFC 1191) with the MTU left for inner packets, and sent back
 * towards its source: at tc egress (the node's own packet, or one it
 * routed) into the same interface's ingress, so the node's stack takes it
 * (its own socket lowers its path MTU) or routes it on; at tc ingress (an
 * xTR's site) back out of the interface it came in by. Its source is the
 * packet's destination: an address the node's routes lead to through this
 * interface, so reverse-path checks pass and no address must be
 * configured here. One answer per refused packet, to its own sender: no
 * amplification. Never about an ICMP error. Returns the verdict, or 0 when
 * no answer could be made (the caller drops). */
static __always_inline int lisp_send_too_big(struct __sk_buff *skb, __u16 inner_mtu, int from_ingress)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct iphdr *orig = data + ETH_HLEN;

	if ((void *)(orig + 1) > end)
		return 0;
	__u32 quoted = orig->ihl * 4 + 8;
	__u8 proto = orig->protocol;
	if (orig->protocol == IPPROTO_ICMP) {
		__u8 *type = (void *)orig + orig->ihl * 4;

		if ((void *)(type + 1) > end)
			return 0;
		/* only echo request/reply, timestamp and info are answered */
		if (*type != 0 && *type != 8 && *type != 13 && *type != 14 &&
		    *type != 15 && *type != 16)
			return 0;
	}
	__be32 saddr = orig->saddr, daddr = orig->daddr;
	__u8 macs[2 * ETH_ALEN];
	mac_copy(macs, eth->h_source);
	mac_copy(macs + ETH_ALEN, eth->h_dest);

	if (bpf_skb_adjust_room(skb, ICMP_ERR_ROOM, BPF_ADJ_ROOM_MAC, 0))
		return 0;
	__u32 want = ETH_HLEN + ICMP_ERR_ROOM + quoted;
	int partial = 0;
	if (skb->len > want && bpf_skb_change_tail(skb, want, 0)) {
		/* The helper refuses to cut off a checksum still left to the
		 * device (CHECKSUM_PARTIAL, as on every TCP segment this node
		 * sends and on what a veth brings in from a local stack): the
		 * TCP checksum field lies past the 8 bytes. Quote the whole
		 * TCP header then (RFC 1812 §4.3.2.3 allows more than 8). */
		if (proto != IPPROTO_TCP)
			return 0;
		want += 12;
		if (skb->len > want && bpf_skb_change_tail(skb, want, 0))
			return 0;
		partial = 1;
	}

	data = (void *)(long)skb->data;
	end = (void *)(long)skb->data_end;
	eth = data;
	struct iphdr *ip = data + ETH_HLEN;
	__u8 *icmp = (void *)(ip + 1);
	if ((void *)(icmp + 8) > end)
		return 0;
	__u32 icmp_len = end - (void *)icmp;
	if (icmp_len > 8 + LISP_ICMP_MAX_QUOTE || icmp_len % 4)
		return 0;

	__builtin_memcpy(data, macs, sizeof(macs));
	eth->h_proto = bpf_htons(ETH_P_IP);
	/* RFC 1191: the next-hop MTU in the low half of the second word. */
	icmp_error_headers(ip, daddr, saddr, icmp_len, LISP_ICMP_DEST_UNREACH, LISP_ICMP_FRAG_NEEDED,
			   bpf_htonl(inner_mtu));
	if (partial) {
		/* The skb still asks for a TCP checksum over the quoted TCP
		 * header, written into its check field: a device (or
		 * skb_checksum_help) on the way would change the quote under
		 * the ICMP checksum. Make that write a no-op: the field X gets
		 * the value the completion computes, ~(S + X) with S the
		 * one's-complement sum of the header's other words, i.e.
		 * X + X = ~S, X = ~S rotated right by one (doubling is a
		 * rotation in one's complement); ~S = 0 takes X = 0xffff, as
		 * the completion writes 0xffff for 0. Local delivery takes
		 * the partial state as verified either way. */
		__u16 *th = (__u16 *)(icmp + quoted); /* icmp + 8 + orig ihl * 4 */
		__u32 s = 0;

		if ((void *)(th + 10) > end)
			return 0;
#pragma unroll
		for (int i = 0; i < 10; i++)
			if (i != 8)
				s += th[i];
		__u16 c = csum_fold(s);
		th[8] = c ? (__u16)((c >> 1) | (c << 15)) : 0xffff;
	}
	icmp_error_csum(icmp, end, 8 + LISP_ICMP_MAX_QUOTE);
	return from_ingress ? bpf_redirect(skb->ifindex, 0) : bpf_redirect(skb->ifindex, BPF_F_INGRESS);
}

/* lisp_encapsulate: an IPv4 packet whose destination an EID mapping covers
 * is encapsulated onto a path and redirected out of that path's interface.
 * Anything else goes on untouched. */
static __always_inline int lisp_encapsulate(struct __sk_buff *skb, int from_ingress)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = data + sizeof(*eth);

	if ((void *)(ip + 1) > end)
		return LISP_TCX_NEXT;
	if (eth->h_proto != bpf_htons(ETH_P_IP) || ip->version != 4 || ip->ihl < 5)
		return LISP_TCX_NEXT;

	struct lisp_eid_key key = {.prefixlen = 32, .addr = ip->daddr};
	struct lisp_eid *m = bpf_map_lookup_elem(&lisp_eids, &key);

	if (!m)
		return LISP_TCX_NEXT; /* not an EID: not ours */
	if (m->flags & LISP_EID_NEGATIVE) {
		lisp_count(LISP_NATIVE);
		return LISP_TCX_NEXT;
	}

	/* The inner flow: ports only when this packet has them (a fragment
	 * hashes without, so all of a datagram's fragments take one path). */
	__u32 ports = 0;
	if ((ip->protocol == IPPROTO_TCP || ip->protocol == IPPROTO_UDP) &&
	    !(ip->frag_off & bpf_htons(LISP_IP_MF | LISP_IP_OFFSET))) {
		__be16 *p = (void *)ip + ip->ihl * 4;

		if ((void *)(p + 2) <= end)
			ports = ((__u32)bpf_ntohs(p[0]) << 16) | bpf_ntohs(p[1]);
	}
	__u32 h = lisp_flow_hash(ip->saddr, ip->daddr, ports, ip->protocol);

	/* A pinned source takes its path when the mapping lists it as usable
	 * (each MPTCP subflow on its own path); otherwise the hash picks among
	 * the best-priority RLOCs by weight. */
	__u32 id;
	int pinned = 0;
	__u32 *pin = bpf_map_lookup_elem(&lisp_pins, &ip->saddr);

	if (pin && lisp_bit(m->usable, *pin & 0xff)) {
		id = *pin & 0xff;
		pinned = 1;
	} else {
		if (!m->nslots)
			return lisp_drop(LISP_DROP_NO_PATH);
		id = m->slots[((h >> 16) % m->nslots) & (LISP_SLOTS - 1)];
	}
	struct lisp_path *path = bpf_map_lookup_elem(&lisp_paths, &id);

	if (!path || !(path->flags & LISP_PATH_UP))
		return lisp_drop(LISP_DROP_NO_PATH);

	__u32 inner_len = bpf_ntohs(ip->tot_len);
	if (inner_len + LISP_OVERHEAD > 0xffff)
		return lisp_drop(LISP_DROP_TOO_BIG);
	/* Nothing is fragmented: a packet that would not fit the path once
	 * encapsulated is dropped. A GSO superpacket is cut by the kernel into
	 * segments of gso_size plus headers: if those fit with the 36 bytes
	 * added, gso_size is kept (the sender already left room, e.g. a route
	 * MTU of path MTU - 36); if only the segments as the sender made them
	 * fit, the helper lowers gso_size by 36 so the outer ones are that size. */
	__u64 adj = BPF_F_ADJ_ROOM_ENCAP_L3_IPV4 | BPF_F_ADJ_ROOM_ENCAP_L4_UDP |
		    BPF_F_ADJ_ROOM_ENCAP_L2(sizeof(struct lisp_hdr));
	if (skb->gso_size) {
		__u32 seg = skb->gso_size + ip->ihl * 4 + 8; /* UDP, or TCP without options */

		if (ip->protocol == IPPROTO_TCP) {
			__u8 *doff = (void *)ip + ip->ihl * 4 + 12;

			if ((void *)(doff + 1) > end)
				return lisp_drop(LISP_DROP_ENCAP_FAILED);
			seg = skb->gso_size + ip->ihl * 4 + (*doff >> 4) * 4;
		}
		if (seg + LISP_OVERHEAD <= path->mtu)
			adj |= BPF_F_ADJ_ROOM_FIXED_GSO;
		else if (seg > path->mtu)
			return lisp_drop(LISP_DROP_TOO_BIG);
	} else if (inner_len + LISP_OVERHEAD > path->mtu) {
		if (ip->frag_off & bpf_htons(LISP_IP_DF)) {
			int verdict = lisp_send_too_big(skb, path->mtu - LISP_OVERHEAD, from_ingress);

			if (verdict) {
				lisp_count(LISP_ICMP_TOO_BIG);
				return verdict;
			}
		}
		return lisp_drop(LISP_DROP_TOO_BIG);
	}

	struct lisp_outer o = {};
	o.ip.version = 4;
	o.ip.ihl = 5;
	o.ip.tos = ip->tos; /* DSCP and ECN copied (RFC 9300 §5.3, RFC 6040 normal mode) */
	o.ip.tot_len = bpf_htons(inner_len + LISP_OVERHEAD);
	o.ip.frag_off = bpf_htons(LISP_IP_DF);
	o.ip.ttl = ip->ttl; /* RFC 9300 §5.3: copied from the inner header */
	o.ip.protocol = IPPROTO_UDP;
	o.ip.saddr = path->local_rloc;
	o.ip.daddr = path->remote_rloc;
	o.udp.source = lisp_src_port(h);
	o.udp.dest = bpf_htons(LISP_DATA_PORT);
	o.udp.len = bpf_htons(inner_len + LISP_OVERHEAD - sizeof(struct iphdr));
	o.udp.check = 0;
	/* N: a fresh nonce per packet (§5.3: random, different per RLOC). */
	__u32 nonce = bpf_get_prandom_u32();
	o.lisp.flags = LISP_FLAG_N;
	o.lisp.nonce[0] = nonce >> 16;
	o.lisp.nonce[1] = nonce >> 8;
	o.lisp.nonce[2] = nonce;
	if (path->flags & LISP_PATH_IID) {
		o.lisp.flags |= LISP_FLAG_I;
		o.lisp.iid_lsb = bpf_htonl((path->iid & 0xffffff) << 8);
	}
	o.ip.check = csum_ipv4(&o.ip);

	__u32 ifindex = path->ifindex;
	int neigh = path->flags & LISP_PATH_NEIGH;
	__u8 macs[2 * ETH_ALEN];
	mac_copy(macs, path->dst_mac);
	mac_copy(macs + ETH_ALEN, path->src_mac);
	__u64 segs = skb->gso_segs ? skb->gso_segs : 1;

	if (bpf_skb_adjust_room(skb, LISP_OVERHEAD, BPF_ADJ_ROOM_MAC, adj))
		return lisp_drop(LISP_DROP_ENCAP_FAILED);

	data = (void *)(long)skb->data;
	end = (void *)(long)skb->data_end;
	if (data + ETH_HLEN + sizeof(o) > end)
		return lisp_drop(LISP_DROP_ENCAP_FAILED);
	if (!neigh)
		__builtin_memcpy(data, macs, sizeof(macs));
	__builtin_memcpy(data + ETH_HLEN, &o, sizeof(o));

	lisp_path_count(id, segs, inner_len, 1);
	lisp_count(LISP_ENCAPSULATED);
	if (pinned)
		lisp_count(LISP_PINNED);
	/* Without MACs, the kernel looks the remote RLOC up in the FIB (out of
	 * this interface) and resolves the next hop's MAC itself. */
	if (neigh)
		return bpf_redirect_neigh(ifindex, 0, 0, 0);
	return bpf_redirect(ifindex, 0);
}

/* lisp_for_local_tcp: is the inner packet TCP of an established socket
 * of the namespace netns (BPF_F_CURRENT_NETNS: this node's; else a netns
 * id as this namespace knows it), so that the stack there delivers it and
 * never forwards it? The lookup is the one the stack's own demultiplexing
 * does. */
static __always_inline int lisp_for_local_tcp(struct __sk_buff *skb, struct iphdr *in, void *end,
					      __s32 netns)
{
	if (in->protocol != IPPROTO_TCP || in->ihl != 5 ||
	    (in->frag_off & bpf_htons(LISP_IP_MF | LISP_IP_OFFSET)))
		return 0;
	__be16 *ports = (void *)(in + 1);
	if ((void *)(ports + 2) > end)
		return 0;
	struct bpf_sock_tuple t = {};
	t.ipv4.saddr = in->saddr;
	t.ipv4.daddr = in->daddr;
	t.ipv4.sport = ports[0];
	t.ipv4.dport = ports[1];
	struct bpf_sock *sk = bpf_sk_lookup_tcp(skb, &t, sizeof(t.ipv4), (__u64)(__u32)netns, 0);
	if (!sk)
		return 0;
	int local = sk->state != BPF_TCP_LISTEN;
	bpf_sk_release(sk);
	return local;
}

/* lisp_for_site_tcp: does this node route the inner packet out of a site
 * interface (lisp_sites) whose far end is a namespace of this host with an
 * established socket for it? Then that namespace delivers it, as this node
 * would its own: an xTR in front of server namespaces (the lab) takes
 * uploads whole. The route is the kernel's (bpf_fib_lookup, as forwarding
 * will choose; tot_len 0: a superpacket is judged by its segments). */
static __always_inline int lisp_for_site_tcp(struct __sk_buff *skb, struct iphdr *in, void *end)
{
	struct bpf_fib_lookup fib = {};

	fib.family = 2; /* AF_INET */
	fib.l4_protocol = in->protocol;
	fib.tos = in->tos;
	fib.ipv4_src = in->saddr;
	fib.ipv4_dst = in->daddr;
	fib.ifindex = skb->ingress_ifindex;
	if (bpf_fib_lookup(skb, &fib, sizeof(fib), BPF_FIB_LOOKUP_SKIP_NEIGH) != BPF_FIB_LKUP_RET_SUCCESS)
		return 0;
	__u32 oif = fib.ifindex;
	__s32 *ns = bpf_map_lookup_elem(&lisp_sites, &oif);
	if (!ns || *ns < 0)
		return 0;
	return lisp_for_local_tcp(skb, in, end, *ns);
}

/* lisp_source_ok: may the remote RLOC rloc send packets from the EID src?
 * Only if the mapping covering src (the longest prefix, as encapsulation
 * would choose) lists a path to rloc: an ETR that took any inner source
 * from a known RLOC would let anyone on the path who can send with that
 * RLOC's address inject packets from any address into the site (the
 * attack run: a WAN router sent the gateway's RLOC with an arbitrary inner
 * source, and the xTR delivered it to the server). */
static __always_inline int lisp_source_ok(__be32 src, __be32 rloc)
{
	struct lisp_eid_key key = {.prefixlen = 32, .addr = src};
	struct lisp_eid *m = bpf_map_lookup_elem(&lisp_eids, &key);

	if (!m || (m->flags & LISP_EID_NEGATIVE))
		return 0;
	for (int i = 0; i < LISP_SLOTS; i++) {
		if (i >= m->nmembers)
			break;
		__u32 id = m->members[i];
		struct lisp_path *p = bpf_map_lookup_elem(&lisp_paths, &id);

		if (p && (p->flags & LISP_PATH_UP) && p->remote_rloc == rloc)
			return 1;
	}
	return 0;
}

/* lisp_decapsulate: UDP 4341 to a local RLOC from a known remote RLOC,
 * from an inner source that RLOC is a locator of, is stripped to the inner
 * packet, which goes on (the stack routes it or delivers it). LISP to a local RLOC that fails a check is dropped and
 * counted; everything else goes on untouched. */
static __always_inline int lisp_decapsulate(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = data + sizeof(*eth);

	if ((void *)(ip + 1) > end)
		return LISP_TCX_NEXT;
	if (eth->h_proto != bpf_htons(ETH_P_IP) || ip->version != 4 || ip->ihl < 5 ||
	    ip->protocol != IPPROTO_UDP)
		return LISP_TCX_NEXT;
	struct udphdr *udp = (void *)ip + ip->ihl * 4;
	if ((void *)(udp + 1) > end)
		return LISP_TCX_NEXT;
	if (udp->dest != bpf_htons(LISP_DATA_PORT))
		return LISP_TCX_NEXT;

	struct lisp_tunnel_key tk = {.local_rloc = ip->daddr, .remote_rloc = ip->saddr};
	__u32 *idp = bpf_map_lookup_elem(&lisp_tunnels, &tk);
	if (!idp) {
		if (bpf_map_lookup_elem(&lisp_locals, &ip->daddr))
			return lisp_drop(LISP_DROP_UNKNOWN_RLOC);
		return LISP_TCX_NEXT; /* LISP, but not to us: someone else's */
	}
	__u32 id = *idp;

	if (ip->frag_off & bpf_htons(LISP_IP_MF | LISP_IP_OFFSET))
		return lisp_drop(LISP_DROP_FRAGMENT);
	if (ip->ihl != 5)
		return lisp_drop(LISP_DROP_MALFORMED);

	struct lisp_outer *o = (void *)ip;
	struct iphdr *in = (void *)(o + 1);
	if ((void *)(in + 1) > end)
		return lisp_drop(LISP_DROP_MALFORMED);

	__u32 outer_len = bpf_ntohs(o->ip.tot_len);
	__u32 inner_len = bpf_ntohs(in->tot_len);
	if (in->version != 4 || in->ihl < 5 || inner_len < in->ihl * 4 ||
	    outer_len != inner_len + LISP_OVERHEAD ||
	    bpf_ntohs(o->udp.len) != outer_len - sizeof(struct iphdr) ||
	    outer_len + ETH_HLEN > skb->len)
		return lisp_drop(LISP_DROP_MALFORMED);
	__u8 flags = o->lisp.flags;
	/* §5.3: N and V are never both set. */
	if ((flags & (LISP_FLAG_N | LISP_FLAG_V)) == (LISP_FLAG_N | LISP_FLAG_V))
		return lisp_drop(LISP_DROP_MALFORMED);

	struct lisp_path *path = bpf_map_lookup_elem(&lisp_paths, &id);
	if (!path || !(path->flags & LISP_PATH_UP))
		return lisp_drop(LISP_DROP_UNKNOWN_RLOC);
	__u32 iid = (flags & LISP_FLAG_I) ? bpf_ntohl(o->lisp.iid_lsb) >> 8 : 0;
	if (path->flags & LISP_PATH_IID) {
		if (!(flags & LISP_FLAG_I) || iid != (path->iid & 0xffffff))
			return lisp_drop(LISP_DROP_WRONG_IID);
	} else if (iid) {
		return lisp_drop(LISP_DROP_WRONG_IID);
	}
	if (!lisp_source_ok(in->saddr, o->ip.saddr))
		return lisp_drop(LISP_DROP_SOURCE_EID);

	/* RFC 9300 §5.3: the inner TTL becomes the outer one when that is
	 * lower; RFC 6040 §4.2: congestion marked on the way is kept. */
	__u8 outer_ttl = o->ip.ttl, outer_ecn = o->ip.tos & 3;
	__u8 inner_ttl = in->ttl, inner_tos = in->tos;
	__u8 new_tos = inner_tos;
	if (outer_ecn == 3) {
		if ((inner_tos & 3) == 0)
			return lisp_drop(LISP_DROP_ECN);
		new_tos = inner_tos | 3;
	}
	__u64 segs = skb->gso_segs ? skb->gso_segs : 1;

	if (skb->gso_size) {
		/* A superpacket's tunnel GSO state must go with the outer
		 * headers, or segmenting the inner packet later breaks it. */
		if (bpf_skb_adjust_room(skb, -LISP_OVERHEAD, BPF_ADJ_ROOM_MAC,
					LISP_ADJ_ROOM_DECAP_L4_UDP)) {
			/* This kernel keeps SKB_GSO_UDP_TUNNEL and
			 * skb->encapsulation. Harmless only where nothing will
			 * segment the inner packet again: TCP for a socket of
			 * this node, or of a namespace behind one of its site
			 * veths (lisp_sites), which receives a superpacket as it
			 * does a GRO'd one. gso_size is kept (FIXED_GSO): it is the
			 * inner segment size the receiver's MSS estimate reads.
			 * The inner header must cover the whole frame, as in a
			 * superpacket TCP built and lisp_encap wrapped; a train
			 * of datagrams UDP GRO glued together (each with its own
			 * LISP header) does not, and is not taken apart here. */
			if (inner_len + LISP_OVERHEAD + ETH_HLEN != skb->len)
				return lisp_drop(LISP_DROP_GSO_DECAP);
			data = (void *)(long)skb->data; /* the helper's call voids packet pointers */
			end = (void *)(long)skb->data_end;
			in = data + ETH_HLEN + LISP_OVERHEAD;
			if ((void *)(in + 1) > end)
				return lisp_drop(LISP_DROP_GSO_DECAP);
			if (!lisp_for_local_tcp(skb, in, end, BPF_F_CURRENT_NETNS) &&
			    !lisp_for_site_tcp(skb, in, end))
				return lisp_drop(LISP_DROP_GSO_DECAP);
			if (bpf_skb_adjust_room(skb, -LISP_OVERHEAD, BPF_ADJ_ROOM_MAC,
						BPF_F_ADJ_ROOM_FIXED_GSO))
				return lisp_drop(LISP_DROP_GSO_DECAP);
			lisp_count(LISP_DECAP_LOCAL_GSO);
		}
	} else if (bpf_skb_adjust_room(skb, -LISP_OVERHEAD, BPF_ADJ_ROOM_MAC, 0)) {
		return lisp_drop(LISP_DROP_DECAP_FAILED);
	}

	data = (void *)(long)skb->data;
	end = (void *)(long)skb->data_end;
	in = data + ETH_HLEN;
	if ((void *)(in + 1) > end)
		return lisp_drop(LISP_DROP_DECAP_FAILED);
	if (new_tos != inner_tos) {
		__be16 old = *(__be16 *)in;

		in->tos = new_tos;
		in->check = csum_replace16(in->check, old, *(__be16 *)in);
	}
	if (outer_ttl < inner_ttl) {
		__be16 *w = (__be16 *)&in->ttl; /* {ttl, protocol} */
		__be16 old = *w;

		in->ttl = outer_ttl;
		in->check = csum_replace16(in->check, old, *w);
	}

	lisp_path_count(id, segs, inner_len, 0);
	lisp_count(LISP_DECAPSULATED);
	return LISP_TCX_NEXT;
}

#endif
