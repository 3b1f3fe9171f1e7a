/* Port space (docs/port-space-datapath.md), two attach points:
 *
 * sliver_ingress, tcx ingress on the host-side end of each sliver link:
 * every frame a sliver sends. The host, not the sliver's kernel, confines
 * it to its uplink's MAC and address and to its own ports and echo ids;
 * then it goes out of the uplink, or, to the shared address itself (the
 * hairpin), to the sliver or the host that holds the port.
 *
 * loopback_egress, tcx egress on the host's lo: the host's own packets to
 * its public address whose port a sliver leases go to that sliver. */
#include "lib/common.h"
#include "lib/maps.h"
#include "lib/parse.h"
#include "lib/drop.h"
#include "lib/policy.h"
#include "lib/redirect.h"
#include "lib/portspace.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define PACKET_HOST_ 0 /* linux/if_packet.h: to us */

const struct portspace_uplink *_portspace_uplink_type __attribute__((unused));
const struct portspace_sliver *_portspace_sliver_type __attribute__((unused));
const struct portspace_vif *_portspace_vif_type __attribute__((unused));
const struct portspace_limits *_portspace_limits_type __attribute__((unused));
const struct portspace_share *_portspace_share_type __attribute__((unused));
const struct portspace_counters *_portspace_counters_type __attribute__((unused));
const struct portspace_frag_key *_portspace_frag_key_type __attribute__((unused));
const struct portspace_frag *_portspace_frag_type __attribute__((unused));
const struct portspace_echo_key *_portspace_echo_key_type __attribute__((unused));
const struct portspace_echo *_portspace_echo_type __attribute__((unused));
const struct portspace_fanout_key *_portspace_fanout_key_type __attribute__((unused));
const enum portspace_share_kind *_portspace_share_kind_type __attribute__((unused));
/* For Go to name the per-sliver drop counters (DROP_PS_FIRST..). */
const enum drop_reason *_drop_reason_type __attribute__((unused));

/* A cheap mix of the sliver's id and the remote: the same request always
 * gets the same id on the wire, so each reply of one ping finds it. */
static __always_inline __u32 portspace_echo_hash(__be16 id, __be32 remote)
{
	__u32 h = ((__u32)id << 16) ^ remote;
	h ^= h >> 15;
	h *= 0x2c1b3c6d;
	h ^= h >> 12;
	return h;
}

/* An echo request from slot to remote on uplink u with id: which id it
 * leaves with (in the sliver's lease) and the record that brings the reply
 * back to it. Returns a drop reason, or 0 with *wire set. */
static __always_inline int portspace_echo_out(__u32 slot, __u32 u, __be32 remote, __be16 id, __be16 *wire, __u64 now)
{
	struct portspace_echo_key k = {.remote = remote, .id = id, .uplink = u};
	struct portspace_echo rec = {.orig_id = id, .slot = slot};
	if (portspace_port_owner(u, bpf_ntohs(id)) == slot) {
		/* Its own id: kept. A record of its own (this request seen
		 * again, or rewritten to this id) stays as it is. */
		struct portspace_echo *e = bpf_map_lookup_elem(&portspace_echo_ids, &k);
		if (!e || e->slot != slot) {
			if (!portspace_share_take(slot, PORTSPACE_SHARE_ECHO, now))
				return DROP_PS_OVER_SHARE;
			if (!trace_mode)
				bpf_map_update_elem(&portspace_echo_ids, &k, &rec, BPF_ANY);
		}
		*wire = id;
		return 0;
	}
	struct portspace_sliver *s = bpf_map_lookup_elem(&portspace_slivers, &slot);
	if (!s)
		return DROP_PS_FOREIGN_ECHO_ID;
	__u32 lo = s->echo_lo[u & (PORTSPACE_MAX_UPLINKS - 1)], hi = s->echo_hi[u & (PORTSPACE_MAX_UPLINKS - 1)];
	if (lo > hi)
		return DROP_PS_FOREIGN_ECHO_ID;
	__u32 size = hi - lo + 1;
	__u32 h = portspace_echo_hash(id, remote);
	/* A few probes from a deterministic start: a candidate whose record
	 * is another request's is taken by that request. */
#pragma unroll
	for (int i = 0; i < PORTSPACE_ECHO_PROBES; i++) {
		__u16 cand = lo + (h + i) % size;
		if (portspace_port_owner(u, cand) != slot)
			continue;
		k.id = bpf_htons(cand);
		struct portspace_echo *e = bpf_map_lookup_elem(&portspace_echo_ids, &k);
		if (e && e->slot == slot && e->orig_id == id) {
			*wire = k.id;
			return 0;
		}
		if (e && e->slot == slot)
			continue;
		if (!portspace_share_take(slot, PORTSPACE_SHARE_ECHO, now))
			return DROP_PS_OVER_SHARE;
		if (!trace_mode)
			bpf_map_update_elem(&portspace_echo_ids, &k, &rec, BPF_ANY);
		*wire = k.id;
		return 0;
	}
	return DROP_PS_FOREIGN_ECHO_ID;
}

/* What a sliver may send over IPv4: from its uplink's address, TCP/UDP
 * from its own ports, echo requests (ids put in its lease), ICMP errors
 * about its own ports; a later fragment only of a datagram whose first
 * fragment it sent. Returns a drop reason, or 0 (with *rewrite set when
 * the echo id at *id_off must become *wire). */
static __always_inline int portspace_check_ipv4(struct packet *pkt, const struct portspace_uplink *up, __u32 slot, __u32 u,
						__be16 *wire, __be16 *old, __u32 *id_off)
{
	struct iphdr *ip = pkt->ip;
	if (ip->saddr != up->addr)
		return DROP_PS_FOREIGN_IP;
	__u8 proto = ip->protocol;
	if (proto != IPPROTO_TCP_ && proto != IPPROTO_UDP_ && proto != IPPROTO_ICMP_)
		return DROP_PS_PROTO;
	struct portspace_frag_key fk = {.remote = ip->daddr, .id = ip->id, .proto = proto, .uplink_dir = u | PORTSPACE_DIR_OUT, .slot = slot};
	if (ip->frag_off & bpf_htons(IP_OFFSET_MASK))
		return portspace_frag_live(&fk, packet_now(pkt)) ? 0 : DROP_PS_FRAG_UNKNOWN;
	__u32 hl = (ip->ihl & 0xf) * 4;
	__u8 *l4 = (void *)ip + hl;
	/* A first fragment too short for its ports (RFC 1858) is malformed. */
	if ((void *)(l4 + 8) > pkt->data_end)
		return DROP_MALFORMED;
	if (proto == IPPROTO_TCP_ || proto == IPPROTO_UDP_) {
		if (portspace_port_owner(u, bpf_ntohs(*(__be16 *)l4)) != slot)
			return DROP_PS_FOREIGN_PORT;
	} else {
		__u8 type = l4[0];
		if (type == ICMP_ECHO_REQUEST) {
			__be16 id = *(__be16 *)(l4 + 4);
			int reason = portspace_echo_out(slot, u, ip->daddr, id, wire, packet_now(pkt));
			if (reason)
				return reason;
			if (*wire != id) {
				*old = id;
				*id_off = ETH_HLEN + hl + 4;
			}
		} else if (is_icmp_error(type)) {
			/* About a packet it was sent: to its address and one of
			 * its ports. */
			struct icmp_quote q;
			if (!icmp_quote_of(l4, 0, pkt->data_end, &q))
				return DROP_MALFORMED;
			if (q.ip->protocol != IPPROTO_TCP_ && q.ip->protocol != IPPROTO_UDP_)
				return DROP_PS_ICMP_REFUSED;
			if (q.ip->daddr != up->addr || portspace_port_owner(u, bpf_ntohs(((__be16 *)q.l4)[1])) != slot)
				return DROP_PS_FOREIGN_PORT;
		} else {
			return DROP_PS_ICMP_REFUSED;
		}
	}
	if (ip->frag_off & bpf_htons(IP_MF))
		return portspace_frag_record(&fk, slot, packet_now(pkt));
	return 0;
}

SEC("tc")
int sliver_ingress(struct __sk_buff *skb)
{
	struct packet pkt = {};
	int reason = parse_packet(skb, &pkt);
	__u32 ifindex = skb->ifindex;
	struct portspace_vif *vif = bpf_map_lookup_elem(&portspace_vifs, &ifindex);
	if (!vif)
		return drop_packet(skb, &pkt, DROP_PS_NO_SLIVER);
	__u32 slot = vif->slot;
	__u32 u = vif->uplink;
	if (skb->vlan_present || reason == DROP_VLAN_TAGGED || reason == DROP_UNSUPPORTED)
		return portspace_drop(skb, &pkt, slot, DROP_PS_NOT_IPV4);
	if (reason)
		return portspace_drop(skb, &pkt, slot, reason);
	struct portspace_uplink *up = bpf_map_lookup_elem(&portspace_uplink_index, &u);
	if (!up || !up->ifindex)
		return portspace_drop(skb, &pkt, slot, DROP_PS_NO_UPLINK);
	if (!mac_equal(pkt.eth->h_source, up->mac))
		return portspace_drop(skb, &pkt, slot, DROP_PS_FOREIGN_MAC);

	if (pkt.arp) {
		/* Asking, as the host: the host answers for the address and
		 * the replies reach every sliver (portspace_from_fabric). */
		struct arp_ipv4 *arp = pkt.arp;
		if (arp->op != bpf_htons(ARPOP_REQUEST) || !mac_equal(arp->sha, up->mac) || arp->spa != up->addr)
			return portspace_drop(skb, &pkt, slot, DROP_PS_ARP_FORGED);
		portspace_count_out(slot, skb->len);
		count_forward(FWD_FROM_SLIVER);
		return redirect_out(up->ifindex);
	}
	if (!pkt.ip) /* parse_packet guarantees it; the verifier cannot know */
		return portspace_drop(skb, &pkt, slot, DROP_MALFORMED);

	__be16 wire = 0, old = 0;
	__u32 id_off = 0;
	reason = portspace_check_ipv4(&pkt, up, slot, u, &wire, &old, &id_off);
	if (reason)
		return portspace_drop(skb, &pkt, slot, reason);
	__be32 daddr = pkt.ip->daddr;
	__u32 uplink_ifindex = up->ifindex;
	__u8 mac[ETH_ALEN];
	mac_copy(mac, up->mac);
	if (id_off) {
		/* Its echo id, put in its lease (docs: ICMP echo ids). */
		if (bpf_l4_csum_replace(skb, id_off - 2, old, wire, 2) < 0 ||
		    bpf_skb_store_bytes(skb, id_off, &wire, 2, 0) < 0) {
			struct packet none = {};
			return portspace_drop(skb, &none, slot, DROP_MALFORMED);
		}
		if (parse_packet(skb, &pkt) || !pkt.ip)
			return portspace_drop(skb, &pkt, slot, DROP_MALFORMED);
	}

	__u32 *hairpin = bpf_map_lookup_elem(&portspace_addrs, &daddr);
	if (!hairpin) {
		portspace_count_out(slot, skb->len);
		count_forward(FWD_FROM_SLIVER);
		return redirect_out(uplink_ifindex);
	}
	/* To the shared address: whoever holds the port, as from the fabric. */
	__u32 h = *hairpin;
	struct portspace_target t = {};
	portspace_steer(&pkt, h, &t);
	__u32 to = t.slot;
	struct portspace_sliver *s = to ? bpf_map_lookup_elem(&portspace_slivers, &to) : 0;
	__u32 peer = (s && h < PORTSPACE_MAX_UPLINKS) ? s->vif[h & (PORTSPACE_MAX_UPLINKS - 1)] : 0;
	if (peer) {
		struct portspace_uplink *hup = bpf_map_lookup_elem(&portspace_uplink_index, &h);
		if (!hup)
			return portspace_drop(skb, &pkt, slot, DROP_PS_NO_UPLINK);
		mac_copy(mac, hup->mac);
		if (portspace_restore_id(skb, &t) < 0 || bpf_skb_store_bytes(skb, 0, mac, ETH_ALEN, 0) < 0) {
			struct packet none = {};
			return portspace_drop(skb, &none, slot, DROP_MALFORMED);
		}
		portspace_count_out(slot, skb->len);
		portspace_count_in(to, skb->len);
		count_forward(FWD_TO_SLIVER);
		return redirect_peer(peer);
	}
	/* The host's own. Its stack takes a frame only as addressed to this
	 * host, and the kernel judged that (the packet type) from the
	 * destination MAC before tcx ran: a frame for the shared MAC, not this
	 * link's, is PACKET_OTHERHOST, which IPv4 drops. So the frame is made
	 * the host's here (bpf_skb_change_type) and goes up in this one pass,
	 * rather than being redirected into the link's ingress and checked
	 * by this program a second time. It carries the link's MAC too, as
	 * the stack would have seen it. */
	if (!mac_equal(pkt.eth->h_dest, vif->mac)) {
		mac_copy(mac, vif->mac);
		if (bpf_skb_store_bytes(skb, 0, mac, ETH_ALEN, 0) < 0 || bpf_skb_change_type(skb, PACKET_HOST_) < 0) {
			struct packet none = {};
			return portspace_drop(skb, &none, slot, DROP_MALFORMED);
		}
	}
	portspace_count_out(slot, skb->len);
	count_forward(FWD_HOST_STACK);
	return TC_ACT_OK;
}

SEC("tc")
int loopback_egress(struct __sk_buff *skb)
{
	struct packet pkt = {};
	/* lo's frames carry an Ethernet header of zeros and the EtherType. */
	if (parse_packet(skb, &pkt) || !pkt.ip)
		return TC_ACT_OK;
	__be32 daddr = pkt.ip->daddr;
	__u32 *idx = bpf_map_lookup_elem(&portspace_addrs, &daddr);
	if (!idx)
		return TC_ACT_OK;
	__u32 u = *idx;
	struct portspace_target t = {};
	portspace_steer(&pkt, u, &t);
	__u32 slot = t.slot;
	if (!slot)
		return TC_ACT_OK;
	struct portspace_sliver *s = bpf_map_lookup_elem(&portspace_slivers, &slot);
	struct portspace_uplink *up = bpf_map_lookup_elem(&portspace_uplink_index, &u);
	if (!s || !up || u >= PORTSPACE_MAX_UPLINKS)
		return TC_ACT_OK;
	__u32 vif = s->vif[u & (PORTSPACE_MAX_UPLINKS - 1)];
	if (!vif)
		return TC_ACT_OK;
	/* The sliver's link takes frames for the uplink's MAC, its own. */
	__u8 macs[2 * ETH_ALEN];
	mac_copy(macs, up->mac);
	mac_copy(macs + ETH_ALEN, up->mac);
	if (portspace_restore_id(skb, &t) < 0 || bpf_skb_store_bytes(skb, 0, macs, sizeof(macs), 0) < 0)
		return drop_quietly(DROP_MALFORMED);
	portspace_count_in(slot, skb->len);
	count_forward(FWD_TO_SLIVER);
	return redirect_out(vif);
}
