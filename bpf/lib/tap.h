/* Virtual TAP (paper 002, §III; docs/tap.md): copies of what a policy
 * names go to its monitor VM, on this host or another, with no SPAN port
 * and no encapsulation.
 *
 * The sender's edge (tap_copy, vif.c) runs on a packet a local VM sent once
 * it is admitted and its production verdict is decided, just before the
 * program returns that verdict: the production frame is neither delayed nor
 * changed (every byte the copies need changed is put back). Each distinct
 * monitor on this host gets one clone into its vif, as the receiver sees
 * the packet; each distinct monitor host gets one clone out of the uplink,
 * host MAC to host MAC, marked as a copy (the paper's rewriting rule).
 *
 * THE COPY MARKER: the IPv4 header's reserved flag (0x8000 of frag_off,
 * which RFC 791 says must be zero), with the header checksum fixed. A VM
 * frame carrying it is dropped at the vif (DROP_RESERVED_FLAG), so no VM
 * can forge a copy; on the fabric a copy is believed only like production
 * frames are (a known host's MAC, the source VM's own host).
 *
 * The monitor's edge (tap_from_fabric, uplink.c) takes a marked frame,
 * clears the flag (the checksum back as it was), re-matches the restored
 * packet against the rules whose monitor is local, gives each matching
 * monitor one copy, and consumes the frame: a copy is never delivered to
 * its receiver or anyone else, and never copied again (copies leave
 * through a vif's egress or the uplink's, where no onehop program runs, and
 * the uplink consumes every marked frame).
 *
 * Matching costs a few lookups, not a walk of every rule: the sender's
 * local address gives the set of rules it can match (one lookup; a VM no
 * rule names stops here), the receiver's address, segment and "any" the
 * set of rules it can match, and only the rules in both are checked for
 * protocol and ports. Each monitor takes copies at a bounded rate (GCRA,
 * share.h): a monitor that cannot keep up loses copies, counted per rule,
 * never production packets. */
#ifndef ONEHOP_TAP_H
#define ONEHOP_TAP_H

#include "common.h"
#include "csum.h"
#include "parse.h"
#include "drop.h"
#include "route.h"
#include "policy.h"
#include "share.h"
#include "redirect.h"
#include "fabric_trust.h"
#include "tap_maps.h"

#define IP_RESERVED_FLAG 0x8000
/* Offsets in the frame (a VLAN tag never gets this far). */
#define TAP_ETH_SAVE 12                /* destination and source MAC */
#define TAP_IP_SAVE_OFF (ETH_HLEN + 6) /* frag_off, ttl, protocol, check */
#define TAP_IP_SAVE 6

static __always_inline int is_tap_copy(const struct iphdr *ip)
{
	return ip->frag_off & bpf_htons(IP_RESERVED_FLAG);
}

/* The index of the lowest set bit of x (x != 0). clang 14's BPF backend
 * crashes on __builtin_ctzll, so: a binary search, six steps. */
static __always_inline __u32 tap_ctz(__u64 x)
{
	__u32 n = 0;
	if (!(x & 0xffffffffULL)) {
		n += 32;
		x >>= 32;
	}
	if (!(x & 0xffff)) {
		n += 16;
		x >>= 16;
	}
	if (!(x & 0xff)) {
		n += 8;
		x >>= 8;
	}
	if (!(x & 0xf)) {
		n += 4;
		x >>= 4;
	}
	if (!(x & 0x3)) {
		n += 2;
		x >>= 2;
	}
	if (!(x & 0x1))
		n += 1;
	return n;
}

/* Takes the lowest slot out of b: -1 when b is empty. */
static __always_inline int tap_pop(struct tap_bits *b)
{
#pragma unroll
	for (int i = 0; i < TAP_WORDS; i++) {
		__u64 w = b->w[i];
		if (w) {
			__u64 low = w & -w;
			b->w[i] = w ^ low;
			return i * 64 + tap_ctz(low);
		}
	}
	return -1;
}

static __always_inline int tap_empty(const struct tap_bits *b)
{
	return !(b->w[0] | b->w[1] | b->w[2] | b->w[3]);
}

/* ORs into acc the slots of one index key; 1 when there were any. */
static __always_inline int tap_or(struct tap_bits *acc, __be32 addr, __u8 role, __u8 side, __u8 kind)
{
	struct tap_key k = {.addr = addr, .role = role, .side = side, .kind = kind};
	struct tap_bits *b = bpf_map_lookup_elem(&tap_index, &k);
	if (!b)
		return 0;
	acc->w[0] |= b->w[0];
	acc->w[1] |= b->w[1];
	acc->w[2] |= b->w[2];
	acc->w[3] |= b->w[3];
	return 1;
}

/* An address's segment key, its farm and subnet bits alone (0.f.s.0), and
 * its farm key, its farm bits alone (0.f.0.0): internal/tap keys them so. */
static __always_inline __be32 tap_segment_mask(void)
{
	return bpf_htonl(plan_id_mask() & ~plan_host_mask());
}

static __always_inline __be32 tap_farm_mask(void)
{
	return bpf_htonl(plan_id_mask() & ~((1U << (plan_subnet_bits + plan_vm_bits)) - 1));
}

/* The rules an address can match on one side: as itself, its segment
 * (0.f.s.0) or any VM of its farm (0.f.0.0): "any" never reaches past a
 * farm, so a monitor sees only the farm it is in. */
static __always_inline void tap_side(struct tap_bits *acc, __be32 addr, __u8 role, __u8 side)
{
	tap_or(acc, addr, role, side, TAP_KEY_IP);
	tap_or(acc, addr & tap_segment_mask(), role, side, TAP_KEY_SEGMENT);
	tap_or(acc, addr & tap_farm_mask(), role, side, TAP_KEY_ANY);
}

/* Keeps in acc only the rules an address can match on one side (as
 * itself, its segment or any), with no set of its own on the stack. */
static __always_inline void tap_and_side(struct tap_bits *acc, __be32 addr, __u8 role, __u8 side)
{
	/* One key, narrowed in place (VM, then 0.f.s.0, then 0.f.0.0): this
	 * runs at the bottom of a call chain whose stack is at the limit. */
	struct tap_key k = {.addr = addr, .role = role, .side = side, .kind = TAP_KEY_IP};
	struct tap_bits *a = bpf_map_lookup_elem(&tap_index, &k);
	k.addr &= tap_segment_mask();
	k.kind = TAP_KEY_SEGMENT;
	struct tap_bits *b = bpf_map_lookup_elem(&tap_index, &k);
	k.addr &= tap_farm_mask();
	k.kind = TAP_KEY_ANY;
	struct tap_bits *c = bpf_map_lookup_elem(&tap_index, &k);
#pragma unroll
	for (int i = 0; i < TAP_WORDS; i++)
		acc->w[i] &= (a ? a->w[i] : 0) | (b ? b->w[i] : 0) | (c ? c->w[i] : 0);
}

enum tap_view {
	TAP_VIEW_ORIG = 0, /* the production frame, as the program left it */
	TAP_VIEW_LOCAL,    /* as the receiver sees it: its MAC, from the sender's or the gateway's */
	TAP_VIEW_REMOTE,   /* marked, from this host's uplink MAC */
	TAP_VIEW_WRAPPED,  /* unmarked, its MACs those of a collector's outer header */
};

/* One packet's walk over its candidate rules (bpf_loop: verified once,
 * however many rules). It shares a 512-byte stack with the entry program,
 * so it is kept small: target sets of one word (TAP_MAX_TARGETS). */
struct tap_walk {
	struct __sk_buff *skb;
	struct tap_bits cand; /* rules still to check */
	__u64 served;         /* targets tried for this packet */
	__u64 sent;           /* ... and whose copy went */
	__u64 now;
	__u32 len;
	__u16 sport, dport; /* host order, with has_ports */
	__u8 proto;
	__u8 has_ports;
	__u8 recover; /* the monitor's edge: targets are local, the frame is ready */
	__u8 view;
	/* The production frame's bytes, and what the views change. */
	__u8 orig_eth[TAP_ETH_SAVE];
	__u8 orig_ip[TAP_IP_SAVE];
	__be16 marked_frag;
	__u8 local_eth[TAP_ETH_SAVE];
	__u8 host_mac[ETH_ALEN];
	__be16 marked_check;
	__u32 key; /* a map key in memory for tap_wrap_send, which has no stack (in the padding) */
};

/* Puts the frame into view v, for target tg (bpf_skb_store_bytes: the
 * clones before made packet pointers stale). */
static __always_inline int tap_view(struct tap_walk *w, const struct tap_target *tg)
{
	struct __sk_buff *skb = w->skb;
	if (!tg->remote) {
		if (w->view == TAP_VIEW_LOCAL)
			return 0;
		if (bpf_skb_store_bytes(skb, 0, w->local_eth, TAP_ETH_SAVE, 0) < 0)
			return -1;
		if (w->view == TAP_VIEW_REMOTE &&
		    bpf_skb_store_bytes(skb, TAP_IP_SAVE_OFF, w->orig_ip, TAP_IP_SAVE, 0) < 0)
			return -1;
		w->view = TAP_VIEW_LOCAL;
		return 0;
	}
	/* Remote: host MAC to host MAC, each target its own host. */
	if (bpf_skb_store_bytes(skb, 0, tg->host_mac, ETH_ALEN, 0) < 0)
		return -1;
	if (w->view == TAP_VIEW_REMOTE)
		return 0;
	if (bpf_skb_store_bytes(skb, ETH_ALEN, w->host_mac, ETH_ALEN, 0) < 0 ||
	    bpf_skb_store_bytes(skb, TAP_IP_SAVE_OFF, &w->marked_frag, 2, 0) < 0 ||
	    bpf_skb_store_bytes(skb, TAP_IP_SAVE_OFF + 4, &w->marked_check, 2, 0) < 0)
		return -1;
	w->view = TAP_VIEW_REMOTE;
	return 0;
}

/* A copy to a collector (tg->encap): the frame as the receiver sees it,
 * wrapped in GRE (and ERSPAN) from this host's uplink address to the
 * collector's. The production frame itself is wrapped for the clone and
 * unwrapped after it (bpf_skb_adjust_room both ways), so it is not
 * copied into a buffer; the bytes it had are put back as for the other
 * views. A frame the guest's stack handed over as one large segment
 * (GSO) is not wrapped: the kernel would segment the clone as the guest's
 * TCP, not as GRE. 1 when the frame is wrapped, ready to clone (the
 * caller unwraps it after). */
static __always_inline __u32 tap_wrap_len(__u8 encap)
{
	if (encap == TAP_ENCAP_GRE)
		return TAP_ENCAP_GRE_LEN;
	if (encap == TAP_ENCAP_ERSPAN2)
		return TAP_ENCAP_ERSPAN2_LEN;
	if (encap == TAP_ENCAP_ERSPAN3)
		return TAP_ENCAP_ERSPAN3_LEN;
	return 0;
}

static __noinline int tap_wrap(struct tap_walk *w, struct tap_target *tg)
{
	/* Its own function, using no stack: the map key in w->key, the
	 * header length in the scratch, few values live across helper calls
	 * (the walk's call chain has no stack to spare). */
	if (w->skb->gso_size || !tap_wrap_len(tg->encap))
		return 0;
	/* The inner IPv4 header as sent: unmarked. */
	if (w->view == TAP_VIEW_REMOTE && bpf_skb_store_bytes(w->skb, TAP_IP_SAVE_OFF, w->orig_ip, TAP_IP_SAVE, 0))
		return 0;
	w->key = 0;
	struct tap_scratch *sc = bpf_map_lookup_elem(&tap_scratch, &w->key);
	if (!sc)
		return 0;
#pragma unroll
	for (int i = 0; i < TAP_ENCAP_MAX / 4; i++)
		((__u32 *)sc->b)[i] = ((const __u32 *)tg->hdr)[i];
	sc->hlen = tap_wrap_len(tg->encap);
	/* Outer total length (the frame, less the outer Ethernet header), and
	 * the checksum the agent computed with it zero. */
	__be16 tot = bpf_htons(w->skb->len + sc->hlen - ETH_HLEN);
	__sum16 *ocheck = (void *)(sc->b + ETH_HLEN + 10);
	*ocheck = csum_replace16(*ocheck, 0, tot);
	*(__be16 *)(sc->b + ETH_HLEN + 2) = tot;
	if (tg->encap != TAP_ENCAP_GRE) {
		/* Racy across CPUs, as the buckets: two CPUs may send one
		 * number. */
		*(__be32 *)(sc->b + ETH_HLEN + 24) = bpf_htonl(tg->seq);
		tg->seq += 1;
	}
	if (tg->encap == TAP_ENCAP_ERSPAN3) /* granularity 100 ns (the agent's Gra bits) */
		*(__be32 *)(sc->b + ETH_HLEN + 32) = bpf_htonl((__u32)(w->now / 100));
	if (bpf_skb_adjust_room(w->skb, sc->hlen, BPF_ADJ_ROOM_MAC, 0))
		return 0;
	w->view = TAP_VIEW_WRAPPED;
	/* The outer headers and the inner EtherType (the template's), then
	 * the inner MACs: as the receiver sees the frame. */
	if (!bpf_skb_store_bytes(w->skb, 0, sc->b, (sc->hlen & 0x3f) + ETH_HLEN, 0) &&
	    !bpf_skb_store_bytes(w->skb, sc->hlen & 0x3f, w->local_eth, TAP_ETH_SAVE, 0))
		return 1;
	bpf_skb_adjust_room(w->skb, -(__s32)sc->hlen, BPF_ADJ_ROOM_MAC, 0);
	return 0;
}

/* One copy to target t, within its rate: 1 when it went. */
static __always_inline int tap_send(struct tap_walk *w, __u32 t)
{
	struct tap_target *tg = bpf_map_lookup_elem(&tap_targets, &t);
	if (!tg || !tg->ifindex)
		return 0;
	if (w->recover && tg->remote)
		return 0; /* the monitor's edge hands copies to local monitors only */
	__u32 zero = 0;
	struct tap_limits *lim = bpf_map_lookup_elem(&tap_config, &zero);
	if (lim && lim->interval_ns) {
		__u64 *bucket = bpf_map_lookup_elem(&tap_buckets, &t);
		if (!bucket || !gcra_take(bucket, lim->interval_ns, lim->burst_ns, w->now))
			return 0;
	}
	if (tg->encap) {
		if (w->recover || !tap_wrap(w, tg))
			return 0;
		long err = clone_out(w->skb, tg->ifindex);
		/* Unwrapped again: the frame's own IPv4 header and beyond are
		 * where they were; its first bytes are the outer Ethernet
		 * header's, put back by the next view or the walk's end. */
		bpf_skb_adjust_room(w->skb, -(__s32)tap_wrap_len(tg->encap), BPF_ADJ_ROOM_MAC, 0);
		if (err)
			return 0;
		count_forward(FWD_TAP_COPY_REMOTE);
		return 1;
	}
	if (!w->recover && tap_view(w, tg) < 0)
		return 0;
	if (clone_to(w->skb, &tg->ifindex) != 0)
		return 0;
	if (w->recover)
		count_forward(FWD_TAP_COPY_RECOVERED);
	else
		count_forward(tg->remote ? FWD_TAP_COPY_REMOTE : FWD_TAP_COPY_LOCAL);
	return 1;
}

/* One candidate rule: checked against the filters the index does not
 * decide; its monitor served once per packet, however many rules name
 * it; its counters told whether its monitor got the copy. */
static long tap_rule_one(__u32 index, void *ctx)
{
	struct tap_walk *w = ctx;
	int slot = tap_pop(&w->cand);
	if (slot < 0)
		return 1;
	__u32 s = slot;
	struct tap_rule *r = bpf_map_lookup_elem(&tap_rules, &s);
	if (!r)
		return 0;
	if (r->proto && r->proto != w->proto)
		return 0;
	if (r->ports) {
		if (!w->has_ports)
			return 0;
		if (w->sport < r->sport_lo || w->sport > r->sport_hi || w->dport < r->dport_lo || w->dport > r->dport_hi)
			return 0;
	}
	__u32 t = r->target;
	if (t >= TAP_MAX_TARGETS)
		return 0;
	__u64 bit = 1ULL << t;
	if (!(w->served & bit)) {
		w->served |= bit;
		if (tap_send(w, t))
			w->sent |= bit;
	}
	struct tap_counters *c = bpf_map_lookup_elem(&tap_stats, &s);
	if (!c)
		return 0;
	if (!(w->sent & bit)) {
		c->dropped += 1;
	} else if (w->recover) {
		c->delivered_packets += 1;
		c->delivered_bytes += w->len;
	} else {
		c->copied_packets += 1;
		c->copied_bytes += w->len;
	}
	return 0;
}

/* What the walk needs of the packet: its length, protocol and ports (of
 * a TCP or UDP header in the frame: not of a later fragment). The caller
 * sets w->now, the packet's one clock read (packet_now). */
static __always_inline void tap_walk_init(struct tap_walk *w, struct __sk_buff *skb, struct iphdr *ip, void *data_end)
{
	w->skb = skb;
	w->len = skb->len;
	w->proto = ip->protocol;
	if ((w->proto == IPPROTO_TCP_ || w->proto == IPPROTO_UDP_) && !(ip->frag_off & bpf_htons(IP_OFFSET_MASK))) {
		__be16 *ports = (void *)ip + (ip->ihl & 0xf) * 4;
		if ((void *)(ports + 2) <= data_end) {
			w->has_ports = 1;
			w->sport = bpf_ntohs(ports[0]);
			w->dport = bpf_ntohs(ports[1]);
		}
	}
}

/* The sender's edge: one copy per distinct monitor of the rules this
 * packet (from a local VM, admitted, its verdict decided) matches.
 *
 * production_first (a constant: each variant is its own function, so no
 * flag takes stack in a call chain at its limit): production leaves by the
 * uplink before its copies, and 1 is returned when it did (the caller
 * consumes the frame). A clone and a redirect out of this host both queue
 * on this CPU's backlog in the order they are made, so a production frame
 * redirected after its copies would wait behind them at every hop to its
 * receiver. Without it the frame is left exactly as it came for the
 * caller's verdict. The caller's packet pointers are stale afterwards. */
static __always_inline int tap_copy_body(struct __sk_buff *skb, const struct node_config *cfg, __u64 now,
					 const int production_first)
{
	/* The entry program checked the headers; only the pointers are
	 * needed again (no struct packet: stack). */
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = (void *)(eth + 1);
	if (!cfg || (void *)(ip + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IP))
		return 0;
	/* now goes into the walk at once: held in a register across the
	 * lookups below it would be spilled, on a stack at its limit. */
	struct tap_walk w = {.now = now};
	/* A local sender's key holds every rule it can match (exact). */
	if (!tap_or(&w.cand, ip->saddr, TAP_ROLE_COPY, TAP_SIDE_SENDER, TAP_KEY_IP))
		return 0;
	tap_and_side(&w.cand, ip->daddr, TAP_ROLE_COPY, TAP_SIDE_RECEIVER);
	if (tap_empty(&w.cand))
		return 0;
	/* Production first, unchanged, now that copies are due. */
	if (production_first) {
		if (clone_out(skb, cfg->uplink_ifindex) != 0)
			return 0; /* production goes by the caller's redirect, uncopied */
		data = (void *)(long)skb->data;
		data_end = (void *)(long)skb->data_end;
		eth = data;
		ip = (void *)(eth + 1);
		if ((void *)(ip + 1) > data_end)
			return 1;
	}
	tap_walk_init(&w, skb, ip, data_end);
	__builtin_memcpy(w.orig_eth, eth, TAP_ETH_SAVE);
	__builtin_memcpy(w.orig_ip, (__u8 *)ip + 6, TAP_IP_SAVE);
	virtual_mac(ip->daddr, w.local_eth);
	virtual_mac(same_subnet(ip->saddr, ip->daddr) ? ip->saddr : gateway_of(ip->daddr), w.local_eth + ETH_ALEN);
	mac_copy(w.host_mac, cfg->uplink_mac);
	w.marked_frag = ip->frag_off | bpf_htons(IP_RESERVED_FLAG);
	w.marked_check = csum_replace16(ip->check, ip->frag_off, w.marked_frag);

	bpf_loop(TAP_MAX_RULES, tap_rule_one, &w, 0);
	if (w.view != TAP_VIEW_ORIG && !production_first) {
		/* The production frame as it was, byte for byte. */
		bpf_skb_store_bytes(skb, 0, w.orig_eth, TAP_ETH_SAVE, 0);
		bpf_skb_store_bytes(skb, TAP_IP_SAVE_OFF, w.orig_ip, TAP_IP_SAVE, 0);
	}
	return production_first;
}

/* Copies of a packet whose production verdict the caller returns. */
static __noinline __attribute__((unused)) int tap_copy(struct __sk_buff *skb, const struct node_config *cfg, __u64 now)
{
	if (trace_mode) /* a copy is sent at once, even from BPF_PROG_RUN */
		return 0;
	return tap_copy_body(skb, cfg, now, 0);
}

/* Copies of a packet bound for the uplink: production is sent first; 1:
 * it was, the caller consumes the frame. */
static __noinline __attribute__((unused)) int tap_copy_first(struct __sk_buff *skb, const struct node_config *cfg, __u64 now)
{
	if (trace_mode)
		return 0;
	return tap_copy_body(skb, cfg, now, 1);
}

/* The monitor's edge: a marked frame from the fabric (tenant IPv4). It is
 * believed as production would be, restored, handed to each local monitor
 * whose rule it matches, and consumed. */
static __always_inline int tap_from_fabric(struct __sk_buff *skb, struct packet *pkt, const struct node_config *cfg)
{
	if (trace_mode) /* its copies would be sent at once, even from BPF_PROG_RUN */
		return TC_ACT_SHOT;
	struct iphdr *ip = pkt->ip;
	if (!ip)
		return drop_packet(skb, pkt, DROP_MALFORMED);
	/* Flooded by the fabric towards another host: never delivered, to no
	 * one (and routine, so not logged). */
	if (!mac_equal(pkt->eth->h_dest, cfg->uplink_mac))
		return drop_quietly(DROP_TAP_COPY_UNKNOWN);
	if (!feature_on(cfg, FEATURE_TAP))
		return drop_packet(skb, pkt, DROP_TAP_COPY_UNKNOWN);
	int learn;
	int reason = fabric_sender(cfg, ip->saddr, pkt->eth->h_source, &learn, pkt);
	if (reason)
		return drop_packet(skb, pkt, reason);
	/* A copy teaches the mapping table nothing: it is no traffic of the
	 * sender to this host. */

	struct tap_walk w = {.recover = 1};
	tap_side(&w.cand, ip->saddr, TAP_ROLE_RECOVER, TAP_SIDE_SENDER);
	tap_and_side(&w.cand, ip->daddr, TAP_ROLE_RECOVER, TAP_SIDE_RECEIVER);
	if (tap_empty(&w.cand))
		return drop_packet(skb, pkt, DROP_TAP_COPY_UNKNOWN);

	/* The recovery rule: the flag cleared (the checksum back with it) and
	 * the MACs the receiver would see, so the monitor gets the original. */
	__be16 frag = ip->frag_off & ~bpf_htons(IP_RESERVED_FLAG);
	ip->check = csum_replace16(ip->check, ip->frag_off, frag);
	ip->frag_off = frag;
	virtual_mac(ip->daddr, pkt->eth->h_dest);
	virtual_mac(same_subnet(ip->saddr, ip->daddr) ? ip->saddr : gateway_of(ip->daddr), pkt->eth->h_source);

	w.now = packet_now(pkt);
	tap_walk_init(&w, skb, ip, pkt->data_end);
	bpf_loop(TAP_MAX_RULES, tap_rule_one, &w, 0);
	if (!w.served)
		return drop_quietly(DROP_TAP_COPY_UNKNOWN); /* matched no rule's filters */
	return TC_ACT_SHOT;                                 /* consumed: each monitor got its copy */
}

#endif
