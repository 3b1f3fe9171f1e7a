/* Published ports (docs/north-south.md): a VM's port reached from outside
 * on a port of its host's uplink-0 address. A publication is a lease of
 * that port, like a slice (internal/lease): one more owner kind in
 * egress_ports, so a packet to it is steered by the same one array lookup
 * as a slice's reply. Only the destination is rewritten on the way in, so
 * the VM sees its client's real address; its replies leave through the
 * VM's egress stage, found by their source in egress_published and given
 * the host's address and public port back. A VM needs no slice, nor its
 * farm egress, for this: its publications are all it reaches outside.
 *
 * Included by egress.h; its two hooks are publish_in (egress_in) and
 * publish_out (egress_out). */
#ifndef ONEHOP_PUBLISH_H
#define ONEHOP_PUBLISH_H

#include "common.h"
#include "parse.h"
#include "drop.h"
#include "policy.h"
#include "egress_maps.h"

/* egress.h's, which includes this file after them; egress_deliver comes
 * after egress_out, whose hook is here. */
static __always_inline int egress_deliver(struct __sk_buff *skb, __be32 vm_addr, __u32 slot);

/* A TCP or UDP packet from the fabric to host's port (host order) of
 * uplink: into its VM when the port is published for this protocol.
 * Another protocol on the port, like any other port, is not publish's: it
 * goes on as before (EGRESS_PASS). The VM's inbound firewall judges every
 * packet, as for any packet entering the VM. */
static __always_inline int publish_in(struct __sk_buff *skb, struct packet *pkt, __u32 uplink, __u16 port,
				      __u32 l4_off, int *verdict)
{
	struct iphdr *ip = pkt->ip;
	__u32 pk = (uplink % EGRESS_UPLINKS) * 65536 + port;
	struct egress_owner *o = bpf_map_lookup_elem(&egress_ports, &pk);
	if (!o || o->kind != EGRESS_OWNER_PUBLISHED || o->proto != ip->protocol)
		return EGRESS_PASS;
	__u32 slot = o->slot;
	__be16 vm_port = o->port;
	struct egress_vm *vm = bpf_map_lookup_elem(&egress_slots, &slot);
	if (!vm || !vm->vm_addr)
		return EGRESS_PASS;
	__be32 vm_addr = vm->vm_addr, host = ip->daddr, remote = ip->saddr;
	__u8 proto = ip->protocol;
	struct endpoint *dst = bpf_map_lookup_elem(&endpoints, &vm_addr);
	if (!dst) {
		*verdict = drop_packet(skb, pkt, DROP_FABRIC_NOT_LOCAL);
		return EGRESS_TAKEN;
	}
	struct node_config *cfg = node_config();
	if (dst->firewall && cfg &&
	    !firewall_allows(vm_addr, FW_SIDE(FW_IN, policy_gen(cfg->policy_epoch)), remote, proto, bpf_ntohs(vm_port))) {
		*verdict = drop_packet(skb, pkt, DROP_FIREWALL_IN);
		return EGRESS_TAKEN;
	}
	if ((ip->frag_off & bpf_htons(IP_MF)) && !trace_mode) {
		/* Its later fragments follow it (egress_in's fragment path). */
		struct egress_frag_key fk = {.remote = remote, .addr = host, .id = ip->id, .proto = proto, .dir = EGRESS_FRAG_IN};
		egress_frag_note(&fk, slot, packet_now(pkt));
	}
	if (take_gateway_hop(ip)) {
		*verdict = drop_packet(skb, pkt, DROP_TTL_EXCEEDED);
		return EGRESS_TAKEN;
	}
	egress_rewrite(skb, proto, ETH_HLEN + 16, host, vm_addr, egress_csum_off(proto, l4_off), l4_off + 2,
		       bpf_htons(port), vm_port);
	*verdict = egress_deliver(skb, vm_addr, slot);
	return EGRESS_TAKEN;
}

/* A VM's later fragment out (no ports): it follows its first fragment,
 * translated by a publication or a slice (egress_frags), with the host's
 * address; one whose first fragment nothing translated is egress_out's to
 * judge. Here rather than there, so that a VM with published ports only
 * (in no egress_vms) sends a large answer whole. */
static __always_inline int publish_later_fragment(struct __sk_buff *skb, struct packet *pkt, __be32 vm_addr,
						  int *verdict)
{
	struct iphdr *ip = pkt->ip;
	struct egress_frag_key fk = {.remote = ip->daddr, .addr = vm_addr, .id = ip->id, .proto = ip->protocol, .dir = EGRESS_FRAG_OUT};
	struct egress_frag *f = bpf_map_lookup_elem(&egress_frags, &fk);
	if (!f || packet_now(pkt) - f->when_ns >= FRAG_LIFETIME_NS)
		return EGRESS_PASS;
	__u32 slot = f->slot;
	struct egress_vm *vm = bpf_map_lookup_elem(&egress_slots, &slot);
	if (!vm || vm->vm_addr != vm_addr || !vm->host_addr)
		return EGRESS_PASS;
	if (take_gateway_hop(ip)) {
		*verdict = drop_packet(skb, pkt, DROP_TTL_EXCEEDED);
		return EGRESS_TAKEN;
	}
	egress_rewrite(skb, ip->protocol, ETH_HLEN + 12, vm_addr, vm->host_addr, 0, 0, 0, 0);
	*verdict = egress_send(skb, vm, egress_counters_of(slot));
	return EGRESS_TAKEN;
}

/* A VM's packet outside the tenant space from one of its published ports
 * (its source): an answer to a client, which leaves with the host's
 * address and the public port. No slice and no destination list: a
 * publication answers whoever reached it. It never opens a TCP connection
 * (a SYN without ACK: DROP_PUBLISH_OPEN), so the port is no way out for a
 * VM without egress; a UDP server answers as the host's own would.
 * EGRESS_PASS: not from a published port. */
static __always_inline int publish_out(struct __sk_buff *skb, struct packet *pkt, __be32 vm_addr, int *verdict)
{
	struct iphdr *ip = pkt->ip;
	__u8 proto = ip->protocol;
	if (proto != IPPROTO_TCP_ && proto != IPPROTO_UDP_)
		return EGRESS_PASS;
	if (ip->frag_off & bpf_htons(IP_OFFSET_MASK))
		return publish_later_fragment(skb, pkt, vm_addr, verdict);
	struct l4_ports p = l4_of(pkt);
	if (!p.known)
		return EGRESS_PASS;
	struct egress_publish_key k = {.vm_addr = vm_addr, .vm_port = p.sport, .proto = proto};
	struct egress_publish *pub = bpf_map_lookup_elem(&egress_published, &k);
	if (!pub)
		return EGRESS_PASS;
	__u32 slot = pub->slot;
	__be16 public_port = pub->public_port;
	struct egress_vm *vm = bpf_map_lookup_elem(&egress_slots, &slot);
	if (!vm || vm->vm_addr != vm_addr || !vm->host_addr)
		return EGRESS_PASS;
	__u32 l4_off = ETH_HLEN + (ip->ihl & 0xf) * 4;
	if (proto == IPPROTO_TCP_) {
		__u8 *fl = (void *)ip + (ip->ihl & 0xf) * 4 + 13;
		if ((void *)(fl + 1) > pkt->data_end || (*fl & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN) {
			*verdict = drop_packet(skb, pkt, DROP_PUBLISH_OPEN);
			return EGRESS_TAKEN;
		}
	}
	/* The host's own services are not reached through the translation. */
	__be32 remote = ip->daddr;
	if (bpf_map_lookup_elem(&egress_addrs, &remote)) {
		*verdict = drop_packet(skb, pkt, DROP_EGRESS_TO_HOST);
		return EGRESS_TAKEN;
	}
	if (take_gateway_hop(ip)) {
		*verdict = drop_packet(skb, pkt, DROP_TTL_EXCEEDED);
		return EGRESS_TAKEN;
	}
	if ((ip->frag_off & bpf_htons(IP_MF)) && !trace_mode) {
		struct egress_frag_key fk = {.remote = remote, .addr = vm_addr, .id = ip->id, .proto = proto, .dir = EGRESS_FRAG_OUT};
		egress_frag_note(&fk, slot, packet_now(pkt));
	}
	egress_rewrite(skb, proto, ETH_HLEN + 12, vm_addr, vm->host_addr, egress_csum_off(proto, l4_off), l4_off,
		       p.sport, public_port);
	*verdict = egress_send(skb, vm, egress_counters_of(slot));
	return EGRESS_TAKEN;
}

#endif
