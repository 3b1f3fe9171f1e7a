/* Port-space isolation (paper 000 §3; docs/port-space-datapath.md).
 * Slivers carry their host's public IPv4 and MAC; the host leases each a
 * port range per uplink. What arrives for a public address is steered by
 * destination port (one array lookup, whatever the number of leases), by
 * echo id for echo replies, by the quoted port or id for ICMP errors;
 * whatever a sliver sends must come from its own ports. Nothing here keeps
 * per-connection state: only fragments (their first fragment's port) and
 * echo ids (who sent the request, and which id it chose) are remembered,
 * each in an LRU where every sliver has a share. */
#ifndef ONEHOP_PORTSPACE_H
#define ONEHOP_PORTSPACE_H

#include "common.h"
#include "parse.h"
#include "drop.h"
#include "policy.h"
#include "redirect.h"
#include "portspace_maps.h"
#include "trace.h"

#define PORTSPACE_DIR_OUT 0x80
#define PORTSPACE_ECHO_PROBES 8
#define DROP_PS_FIRST DROP_PS_NO_SLIVER
#define DROP_PS_LAST DROP_PS_OVER_SHARE

static __always_inline struct portspace_counters *portspace_counters_of(__u32 slot)
{
	return bpf_map_lookup_elem(&portspace_stats, &slot);
}

static __always_inline void portspace_count_in(__u32 slot, __u32 len)
{
	if (trace_mode)
		return;
	struct portspace_counters *c = portspace_counters_of(slot);
	if (c) {
		c->packets_in += 1;
		c->bytes_in += len;
	}
}

static __always_inline void portspace_count_out(__u32 slot, __u32 len)
{
	if (trace_mode)
		return;
	struct portspace_counters *c = portspace_counters_of(slot);
	if (c) {
		c->packets_out += 1;
		c->bytes_out += len;
	}
}

/* Drops a sliver's frame: counted for the node (drop.h) and for the sliver. */
static __always_inline int portspace_drop(struct __sk_buff *skb, struct packet *pkt, __u32 slot, __u32 reason)
{
	struct portspace_counters *c = trace_mode ? 0 : portspace_counters_of(slot);
	if (c) {
		__u32 i = 0;
		if (reason >= DROP_PS_FIRST && reason <= DROP_PS_LAST)
			i = 1 + reason - DROP_PS_FIRST;
		if (i < PORTSPACE_DROP_SLOTS)
			c->drops[i] += 1;
	}
	return drop_packet(skb, pkt, reason);
}

/* One unit of slot's share of kind (a GCRA bucket, as share.h): 1 allowed,
 * 0 refused. Only a new record takes one; refreshing a record does not. */
static __always_inline int portspace_share_take(__u32 slot, const __u32 kind, __u64 now)
{
	__u32 zero = 0;
	struct portspace_limits *cfg = bpf_map_lookup_elem(&portspace_config, &zero);
	if (!cfg)
		return 1;
	__u64 interval = cfg->interval_ns[kind];
	if (!interval)
		return 1;
	struct portspace_share *s = bpf_map_lookup_elem(&portspace_shares, &slot);
	if (!s)
		return 0;
	if (trace_mode) { /* the same answer, on a copy of the bucket */
		__u64 next = s->next_ns[kind];
		return gcra_take(&next, interval, cfg->burst_ns[kind], now);
	}
	if (!gcra_take(&s->next_ns[kind], interval, cfg->burst_ns[kind], now)) {
		__sync_fetch_and_add(&s->refused[kind], 1);
		return 0;
	}
	return 1;
}

/* Port space's fragment records (portspace_frags), one implementation for both
 * directions: a sliver's own datagrams (portspace.c) and datagrams steered to
 * a sliver (portspace_steer). A later fragment follows a record younger than
 * FRAG_LIFETIME_NS, as the router's frag_flows (frag.h). */
static __always_inline struct portspace_frag *portspace_frag_live(const struct portspace_frag_key *k, __u64 now)
{
	struct portspace_frag *f = bpf_map_lookup_elem(&portspace_frags, k);
	if (f && now - f->when_ns < FRAG_LIFETIME_NS)
		return f;
	return 0;
}

/* Records a first fragment (MF set) for slot: a record it already has is
 * refreshed; only a new one takes a unit of slot's share, so a datagram
 * sent again costs its sender nothing. 0, or DROP_PS_OVER_SHARE when a new
 * record was refused. */
static __always_inline int portspace_frag_record(const struct portspace_frag_key *k, __u32 slot, __u64 now)
{
	struct portspace_frag *seen = bpf_map_lookup_elem(&portspace_frags, k);
	if (seen && seen->slot == slot) {
		if (!trace_mode)
			seen->when_ns = now;
		return 0;
	}
	if (!portspace_share_take(slot, PORTSPACE_SHARE_FRAGS, now))
		return DROP_PS_OVER_SHARE;
	if (trace_mode)
		return 0;
	struct portspace_frag f = {.when_ns = now, .slot = slot};
	bpf_map_update_elem(&portspace_frags, k, &f, BPF_ANY);
	return 0;
}

/* Where a packet for a public address goes, and the echo id to put back
 * (at id_off, checksum at csum_off) when its sliver's id was rewritten. */
struct portspace_target {
	__u32 slot;
	__u32 id_off;
	__u32 csum_off;
	__be16 id;      /* the id now in the packet */
	__be16 orig_id; /* the sliver's own */
};

/* The sliver whose echo request to remote left with id: 0 for none. */
static __always_inline __u32 portspace_echo_owner(__be32 remote, __be16 id, __u32 u, struct portspace_target *t, __u32 id_off, __u32 csum_off)
{
	struct portspace_echo_key k = {.remote = remote, .id = id, .uplink = u};
	struct portspace_echo *e = bpf_map_lookup_elem(&portspace_echo_ids, &k);
	if (!e)
		return 0;
	/* Only an id of its lease left on the wire: a record of a sliver that
	 * lost the lease since delivers nothing. */
	if (portspace_port_owner(u, bpf_ntohs(id)) != e->slot)
		return 0;
	if (e->orig_id != id) {
		t->id_off = id_off;
		t->csum_off = csum_off;
		t->id = id;
		t->orig_id = e->orig_id;
	}
	return e->slot;
}

/* The owner of the flow an ICMP error quotes (icmp: its header, at
 * icmp_off in the frame): the quoted packet left from public (one of this
 * host's addresses on uplink u), so its source port or echo id says whose. */
static __always_inline __u32 portspace_error_owner(struct packet *pkt, __u8 *icmp, __u32 icmp_off, __be32 public, __u32 u, struct portspace_target *t)
{
	struct icmp_quote q;
	if (!icmp_quote_of(icmp, icmp_off, pkt->data_end, &q) || q.ip->saddr != public)
		return 0;
	if (q.ip->protocol == IPPROTO_TCP_ || q.ip->protocol == IPPROTO_UDP_)
		return portspace_port_owner(u, bpf_ntohs(*(__be16 *)q.l4));
	if (q.ip->protocol == IPPROTO_ICMP_ && q.l4[0] == ICMP_ECHO_REQUEST)
		return portspace_echo_owner(q.ip->daddr, *(__be16 *)(q.l4 + 4), u, t, q.l4_off + 4, icmp_off + 2);
	return 0;
}

/* Which sliver a packet to public (the address of uplink u) belongs to: 0
 * for the host's own stack. A later fragment goes where its first went,
 * if that was a sliver; a first fragment steered to a sliver is recorded
 * (on the sliver's share). */
static __always_inline void portspace_steer(struct packet *pkt, __u32 u, struct portspace_target *t)
{
	struct iphdr *ip = pkt->ip;
	__u8 proto = ip->protocol;
	t->slot = 0;
	t->id_off = 0;
	if (ip->frag_off & bpf_htons(IP_OFFSET_MASK)) {
		struct portspace_frag_key k = {.remote = ip->saddr, .id = ip->id, .proto = proto, .uplink_dir = u};
		struct portspace_frag *f = portspace_frag_live(&k, packet_now(pkt));
		if (f)
			t->slot = f->slot;
		return;
	}
	__u32 hl = (ip->ihl & 0xf) * 4;
	__u8 *l4 = (void *)ip + hl;
	if ((void *)(l4 + 8) > pkt->data_end)
		return;
	__u32 l4_off = ETH_HLEN + hl;
	if (proto == IPPROTO_TCP_ || proto == IPPROTO_UDP_) {
		t->slot = portspace_port_owner(u, bpf_ntohs(((__be16 *)l4)[1]));
	} else if (proto == IPPROTO_ICMP_) {
		__u8 type = l4[0];
		if (type == ICMP_ECHO_REPLY)
			t->slot = portspace_echo_owner(ip->saddr, *(__be16 *)(l4 + 4), u, t, l4_off + 4, l4_off + 2);
		else if (is_icmp_error(type))
			t->slot = portspace_error_owner(pkt, l4, l4_off, ip->daddr, u, t);
	}
	if (t->slot && (ip->frag_off & bpf_htons(IP_MF))) {
		/* Over its share the first fragment is still delivered; its later
		 * fragments then go to the host. */
		struct portspace_frag_key k = {.remote = ip->saddr, .id = ip->id, .proto = proto, .uplink_dir = u};
		portspace_frag_record(&k, t->slot, packet_now(pkt));
	}
}

/* Puts the sliver's own echo id back (the frame's pointers are stale
 * afterwards). */
static __always_inline int portspace_restore_id(struct __sk_buff *skb, struct portspace_target *t)
{
	if (!t->id_off)
		return 0;
	if (bpf_l4_csum_replace(skb, t->csum_off, t->id, t->orig_id, 2) < 0)
		return -1;
	return bpf_skb_store_bytes(skb, t->id_off, &t->orig_id, 2, 0);
}

/* What one walk over an uplink's sliver links needs (bpf_loop). */
struct portspace_fan_walk {
	struct __sk_buff *skb;
	__u32 uplink;
};

static long portspace_fan_one(__u32 index, void *ctx)
{
	struct portspace_fan_walk *w = ctx;
	struct portspace_fanout_key k = {.uplink = w->uplink, .index = index};
	__u32 *ifindex = bpf_map_lookup_elem(&portspace_fanout, &k);
	if (!ifindex || !*ifindex)
		return 0;
	if (clone_out(w->skb, *ifindex) == 0)
		count_forward(FWD_TO_SLIVER);
	return 0;
}

/* From the fabric, on an uplink, for a node with slivers: what is theirs
 * goes to them, the rest to the host's stack as before. */
static __always_inline int portspace_from_fabric(struct __sk_buff *skb, struct packet *pkt)
{
	__u32 ifindex = skb->ifindex;
	struct portspace_uplink *up = bpf_map_lookup_elem(&portspace_uplinks, &ifindex);
	if (!up)
		goto host;
	if (pkt->arp) {
		/* Only the host answers for the public address; a reply to it
		 * answers whoever asked, host or sliver (they share the MAC). */
		if (pkt->arp->op == bpf_htons(ARPOP_REPLY) && pkt->arp->tpa == up->addr && up->vifs && !trace_mode) {
			struct portspace_fan_walk w = {.skb = skb, .uplink = up->index};
			bpf_loop(up->vifs, portspace_fan_one, &w, 0);
		}
		goto host;
	}
	struct iphdr *ip = pkt->ip;
	if (!ip || ip->daddr != up->addr || !mac_equal(pkt->eth->h_dest, up->mac))
		goto host;
	__u32 u = up->index;
	struct portspace_target t = {};
	portspace_steer(pkt, u, &t);
	if (!t.slot)
		goto host;
	__u32 slot = t.slot;
	struct portspace_sliver *s = bpf_map_lookup_elem(&portspace_slivers, &slot);
	if (!s || u >= PORTSPACE_MAX_UPLINKS || !s->vif[u & (PORTSPACE_MAX_UPLINKS - 1)])
		goto host;
	__u32 vif = s->vif[u & (PORTSPACE_MAX_UPLINKS - 1)];
	if (portspace_restore_id(skb, &t) < 0)
		return drop_quietly(DROP_MALFORMED);
	portspace_count_in(slot, skb->len);
	count_forward(FWD_TO_SLIVER);
	return redirect_peer(vif);
host:
	count_forward(FWD_HOST_STACK);
	return TC_ACT_OK;
}

#endif
