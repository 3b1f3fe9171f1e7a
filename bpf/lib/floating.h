/* Floating addresses (docs/north-south.md): an operator's fabric address
 * given whole to one VM. It is an egress_addrs entry of kind
 * EGRESS_ADDR_FLOATING naming the VM's egress slot, on the VM's current
 * host only; the slot's floating field names it back, so an entry left
 * behind by a change half made steers nothing. In: every packet to it
 * (any protocol, any port) has its destination put back to the VM's
 * address and goes into the VM. Out: the VM's packets outside the tenant
 * space leave with it as their source, ports as they were: no slice port
 * is claimed, so nothing of the translation lives on a host and a live
 * move keeps every connection. The host answers ARP for it with its
 * uplink's MAC; the agent announces it (a gratuitous ARP) when it arrives.
 *
 * Included by egress.h, after the helpers it shares (egress_rewrite,
 * egress_deliver, egress_send). */
#ifndef ONEHOP_FLOATING_H
#define ONEHOP_FLOATING_H

#include "conntrack.h"
#include "arp.h"

/* Defined in egress.h after egress_out, which calls floating_out. */
static __always_inline int egress_deliver(struct __sk_buff *skb, __be32 vm_addr, __u32 slot);

/* Remembers a flow the VM's rules just admitted (dir: its direction in
 * k) at the rules of epoch, out of the VM's share
 * of new flows like admit's. A function of its own: its locals would add
 * to floating_admit's frame, under firewall_allows' in the deepest call. */
static __attribute__((noinline)) int floating_open(struct ct_key *k, struct ct_entry *e, __be32 vm, __u8 dir, __u32 epoch)
{
	__u64 now = bpf_ktime_get_coarse_ns();
	if (!e && !share_take(vm, SHARE_FLOWS, now))
		return DROP_OVER_SHARE;
	ct_open(k, e, dir, epoch, now);
	return DROP_NONE;
}

/* The VM's firewall for a packet between it and remote, stateful like
 * admit's (policy.h) but without visibility rules (remote is no tenant):
 * a packet of a flow the VM's rules admitted, either way, passes on the
 * flow's conntrack entry; one that opens a flow is checked against the
 * rules of its direction and remembered. After a rule change a flow is
 * checked again, the way it was opened. A non-first fragment opens
 * nothing: only a rule for its whole protocol passes it. out: the VM sent
 * it. A function of its own, so the uplink program's frame stays small. */
static __attribute__((noinline)) int floating_admit(struct packet *pkt, __be32 vm, __u32 epoch, int out)
{
	struct iphdr *ip = pkt->ip;
	struct l4_ports l4 = l4_of(pkt);
	__be32 remote = out ? ip->daddr : ip->saddr;
	__u8 proto = ip->protocol, gen = policy_gen(epoch);
	__u8 my_dir = out ? FW_OUT : FW_IN;
	if (!l4.known) {
		if (!firewall_allows(vm, FW_SIDE(my_dir, gen), remote, proto, 0))
			return out ? DROP_FIREWALL_OUT : DROP_FIREWALL_IN;
		return DROP_NONE;
	}
	int is_icmp = proto == IPPROTO_ICMP_;
	int opens = !(is_icmp && l4.icmp_type != ICMP_ECHO_REQUEST);
	int answers = !(is_icmp && l4.icmp_type != ICMP_ECHO_REPLY);
	/* Keyed by the VM's own address both ways: the floating one is only
	 * on the wire. */
	struct flow f = {.saddr = out ? vm : remote, .daddr = out ? remote : vm, .sport = l4.sport, .dport = l4.dport, .proto = proto};
	struct ct_key k;
	__u8 dir = ct_key_of(&f, &k);
	__u8 back = dir ^ CT_OPENED_BOTH;
	__u64 now = packet_now(pkt);
	struct ct_entry *e = bpf_map_lookup_elem(&conntrack, &k);
	if (e && ct_live(e, now) && !(e->opened & CT_CUT)) {
		__u8 way = (opens && (e->opened & dir)) ? dir : (answers && (e->opened & back)) ? back
												: 0;
		if (way) {
			if (e->epoch != epoch) {
				/* The opener's direction and port. */
				int opener_out = (way == dir) == (out != 0);
				__u16 port = flow_port(proto, way == dir ? l4.dport : l4.sport);
				if (!firewall_allows(vm, FW_SIDE(opener_out ? FW_OUT : FW_IN, gen), remote, proto, port)) {
					if (!trace_mode)
						e->opened |= CT_CUT;
					return DROP_REVOKED;
				}
				if (!trace_mode)
					e->epoch = epoch;
			}
			ct_touch(e, now);
			return DROP_NONE;
		}
	}
	__u16 port = opens ? flow_port(proto, l4.dport) : 0;
	if (!firewall_allows(vm, FW_SIDE(my_dir, gen), remote, proto, port))
		return out ? DROP_FIREWALL_OUT : DROP_FIREWALL_IN;
	if (!opens)
		return DROP_NONE;
	return floating_open(&k, e, vm, dir, epoch);
}

/* The L4 checksum that covers the addresses (TCP's, UDP's), or 0: ICMP's
 * does not, other protocols' are theirs, and a later fragment's is in its
 * first fragment. */
static __always_inline __u32 floating_csum_off(const struct packet *pkt, __u32 l4_off)
{
	__u8 proto = pkt->ip->protocol;
	if (pkt->ip->frag_off & bpf_htons(IP_OFFSET_MASK))
		return 0;
	if (proto != IPPROTO_TCP_ && proto != IPPROTO_UDP_)
		return 0;
	return egress_csum_off(proto, l4_off);
}

/* In the packet an ICMP error (at l4_off) quotes (q), rewrites the address
 * at addr_off (12: the quoted source, 16: its destination) from `from` to
 * `to`, patching the quoted IPv4 checksum, a quoted UDP checksum (whose
 * pseudo-header holds both addresses; 0, none, kept; TCP's lies past the 8
 * bytes quoted) and the ICMP checksum over all of them. */
static __always_inline void floating_requote(struct __sk_buff *skb, __u32 l4_off, const struct icmp_quote *q, __u32 addr_off,
					     __be32 from, __be32 to)
{
	__u32 icmp_csum = l4_off + 2;
	__u32 inner_off = l4_off + 8;
	__be16 old_check = q->ip->check;
	__be16 old_ucsum = q->ip->protocol == IPPROTO_UDP_ ? *(__be16 *)(q->l4 + 6) : 0;
	__u32 ucsum_off = q->l4_off + 6;
	if (old_ucsum) {
		__be16 u = csum_replace16(csum_replace16(old_ucsum, from & 0xffff, to & 0xffff), from >> 16, to >> 16);
		if (!u)
			u = 0xffff;
		bpf_l4_csum_replace(skb, icmp_csum, old_ucsum, u, 2);
		bpf_skb_store_bytes(skb, ucsum_off, &u, 2, 0);
	}
	__be16 new_check = csum_replace16(csum_replace16(old_check, from & 0xffff, to & 0xffff), from >> 16, to >> 16);
	bpf_l4_csum_replace(skb, icmp_csum, from, to, 4);
	bpf_l4_csum_replace(skb, icmp_csum, old_check, new_check, 2);
	bpf_skb_store_bytes(skb, inner_off + addr_off, &to, 4, 0);
	bpf_skb_store_bytes(skb, inner_off + 10, &new_check, 2, 0);
}

/* A VM with a floating address, to remote outside the tenant space (its
 * destination list already checked): out with the floating address as its
 * source, every protocol, ports as they are. */
static __always_inline int floating_out(struct __sk_buff *skb, struct packet *pkt, const struct vif_info *vif,
					const struct egress_vm *vm, struct egress_counters *c, __u32 epoch)
{
	struct iphdr *ip = pkt->ip;
	__be32 vm_addr = vif->ip, fl = vm->floating;
	if (vif->firewall) {
		int reason = floating_admit(pkt, vm_addr, epoch, 1);
		if (reason)
			return drop_packet(skb, pkt, reason);
	}
	int r = take_gateway_hop(ip);
	if (r)
		return drop_packet(skb, pkt, r);
	__u32 l4_off = ETH_HLEN + (ip->ihl & 0xf) * 4;
	/* Read before a rewrite of the quote makes the packet's pointers stale. */
	__u8 proto = ip->protocol;
	__u32 csum_off = floating_csum_off(pkt, l4_off);
	/* The VM's own error about a packet sent to it (port unreachable):
	 * the quote names the floating address, as the sender knows it. */
	__u8 *icmp = (void *)ip + (ip->ihl & 0xf) * 4;
	struct icmp_quote q;
	if (proto == IPPROTO_ICMP_ && !(ip->frag_off & bpf_htons(IP_OFFSET_MASK)) && (void *)(icmp + 8) <= pkt->data_end &&
	    is_icmp_error(icmp[0]) && icmp_quote_of(icmp, l4_off, pkt->data_end, &q) && q.ip->daddr == vm_addr)
		floating_requote(skb, l4_off, &q, 16, vm_addr, fl);
	egress_rewrite(skb, proto, ETH_HLEN + 12, vm_addr, fl, csum_off, 0, 0, 0);
	return egress_send(skb, vm, c);
}

/* An ICMP error to the floating address quoting a packet the VM sent
 * (from the floating address): into the VM, quoting its own address. Its
 * firewall passes it only for a flow it admitted. */
static __always_inline int floating_error_in(struct __sk_buff *skb, struct packet *pkt, __be32 fl, __be32 vm_addr,
					     __u32 slot, int fw, __u32 l4_off)
{
	struct icmp_quote q;
	__u8 *icmp = (void *)pkt->data + l4_off;
	if ((void *)(icmp + 8) > pkt->data_end)
		return drop_packet(skb, pkt, DROP_MALFORMED);
	if (!icmp_quote_of(icmp, l4_off, pkt->data_end, &q))
		return drop_packet(skb, pkt, DROP_MALFORMED);
	struct iphdr *in = q.ip;
	if (in->saddr != fl || in->daddr != pkt->ip->saddr)
		return drop_packet(skb, pkt, DROP_FIREWALL_IN); /* a third party's word about a flow */
	if (fw) {
		struct flow f = {.saddr = vm_addr, .daddr = in->daddr, .proto = in->protocol};
		__be16 *ports = (void *)q.l4;
		if (in->protocol == IPPROTO_ICMP_)
			f.sport = f.dport = ports[2];
		else if (in->protocol == IPPROTO_TCP_ || in->protocol == IPPROTO_UDP_) {
			f.sport = ports[0];
			f.dport = ports[1];
		}
		struct ct_key k;
		ct_key_of(&f, &k);
		struct ct_entry *e = bpf_map_lookup_elem(&conntrack, &k);
		if (!e || !ct_live(e, packet_now(pkt)) || (e->opened & CT_CUT))
			return drop_packet(skb, pkt, DROP_FIREWALL_IN);
	}
	if (take_gateway_hop(pkt->ip))
		return drop_packet(skb, pkt, DROP_TTL_EXCEEDED);
	floating_requote(skb, l4_off, &q, 12, fl, vm_addr);
	bpf_l3_csum_replace(skb, ETH_HLEN + 10, fl, vm_addr, 4);
	bpf_skb_store_bytes(skb, ETH_HLEN + 16, &vm_addr, 4, 0);
	return egress_deliver(skb, vm_addr, slot);
}

/* A packet from the fabric to a floating address of this host (a): to its
 * VM, whatever it carries, through the VM's firewall. An entry whose slot
 * no longer names it (a change half made) takes nothing. */
static __always_inline int floating_in(struct __sk_buff *skb, struct packet *pkt, const struct egress_addr *a,
				       int *verdict)
{
	struct iphdr *ip = pkt->ip;
	__be32 fl = ip->daddr;
	__u32 slot = a->slot;
	struct egress_vm *vm = bpf_map_lookup_elem(&egress_slots, &slot);
	if (!vm || vm->floating != fl || !vm->vm_addr)
		return EGRESS_PASS;
	__be32 vm_addr = vm->vm_addr;
	struct endpoint *dst = bpf_map_lookup_elem(&endpoints, &vm_addr);
	if (!dst) {
		*verdict = drop_quietly(DROP_FABRIC_NOT_LOCAL);
		return EGRESS_TAKEN;
	}
	int fw = dst->firewall;
	__u32 l4_off = ETH_HLEN + (ip->ihl & 0xf) * 4;
	if (ip->protocol == IPPROTO_ICMP_ && !(ip->frag_off & bpf_htons(IP_OFFSET_MASK))) {
		__u8 *icmp = (void *)ip + (ip->ihl & 0xf) * 4;
		if ((void *)(icmp + 1) <= pkt->data_end && is_icmp_error(icmp[0])) {
			*verdict = floating_error_in(skb, pkt, fl, vm_addr, slot, fw, l4_off);
			return EGRESS_TAKEN;
		}
	}
	if (fw) {
		__u32 epoch = 0;
		struct node_config *cfg = node_config();
		if (cfg)
			epoch = cfg->policy_epoch;
		int reason = floating_admit(pkt, vm_addr, epoch, 0);
		if (reason) {
			*verdict = drop_packet(skb, pkt, reason);
			return EGRESS_TAKEN;
		}
	}
	if (take_gateway_hop(ip)) {
		*verdict = drop_packet(skb, pkt, DROP_TTL_EXCEEDED);
		return EGRESS_TAKEN;
	}
	egress_rewrite(skb, ip->protocol, ETH_HLEN + 16, fl, vm_addr, floating_csum_off(pkt, l4_off), 0, 0, 0);
	*verdict = egress_deliver(skb, vm_addr, slot);
	return EGRESS_TAKEN;
}

/* An ARP request from the fabric for a floating address this host holds:
 * answered in place with the uplink's MAC, the way to its VM. Returns -1
 * when it is not one (the caller goes on as before), else the verdict. A
 * host that no longer holds the address has no entry, so it falls silent
 * at once. A claim of the address by someone else (an announcement, or a
 * question from the address itself) goes to the host's stack. */
static __always_inline int floating_arp(struct packet *pkt, const struct node_config *cfg)
{
	struct arp_ipv4 *arp = pkt->arp;
	if (arp->op != bpf_htons(ARPOP_REQUEST))
		return -1;
	__be32 tpa = arp->tpa;
	if (arp->spa == tpa)
		return -1;
	struct egress_addr *a = bpf_map_lookup_elem(&egress_addrs, &tpa);
	if (!a || a->kind != EGRESS_ADDR_FLOATING)
		return -1;
	__u32 slot = a->slot;
	struct egress_vm *vm = bpf_map_lookup_elem(&egress_slots, &slot);
	if (!vm || vm->floating != tpa)
		return -1;
	arp_reply_in_place(pkt, tpa, cfg->uplink_mac, cfg->uplink_mac);
	count_forward(FWD_ARP_ANSWERED);
	return redirect_out(cfg->uplink_ifindex);
}

#endif
