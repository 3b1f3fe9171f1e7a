/* tcx ingress on the host's uplink: frames from the fabric. VM traffic
 * addressed to this host gets its virtual MACs back and goes straight into
 * the VM; ARP about VM addresses is the ARP engine's; anything outside the
 * tenant address space is the host's own management traffic (etcd, ARP
 * between hosts) and goes to its stack. */
#include "lib/common.h"
#include "lib/maps.h"
#include "lib/parse.h"
#include "lib/drop.h"
#include "lib/route.h"
#include "lib/policy.h"
#include "lib/broadcast.h"
#include "lib/mapping.h"
#include "lib/arp.h"
#include "lib/redirect.h"
#include "lib/fabric_trust.h"
#include "lib/frag.h"
#include "lib/portspace.h"
#include "lib/tap.h"
#include "lib/egress.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* A packet from the fabric to a floating address this host holds
 * (floating.h), handed on by uplink_ingress's tail call: floating_in's
 * firewall check inlined there would take the program past BPF's 512-byte
 * stack. Only floating_tail reaches it: nothing attaches it. */
SEC("tc")
int uplink_floating(struct __sk_buff *skb)
{
	struct packet pkt = {};
	int reason = parse_packet(skb, &pkt);
	if (reason || !pkt.ip)
		return drop_packet(skb, &pkt, reason ? reason : DROP_MALFORMED);
	__be32 fl = pkt.ip->daddr;
	struct egress_addr *a = bpf_map_lookup_elem(&egress_addrs, &fl);
	int verdict = TC_ACT_SHOT;
	if (a && a->kind == EGRESS_ADDR_FLOATING && floating_in(skb, &pkt, a, &verdict) == EGRESS_TAKEN)
		return verdict;
	count_forward(FWD_HOST_STACK); /* the entry went meanwhile */
	return TC_ACT_OK;
}

/* uplink_ingress's way into uplink_floating. Not pinned: each loaded
 * instance has its own, filled by the loader. */
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
	__array(values, int(struct __sk_buff *));
} floating_tail SEC(".maps") = {
	.values = {[0] = (void *)&uplink_floating},
};

SEC("tc")
int uplink_ingress(struct __sk_buff *skb)
{
	/* A tag the device took out of the frame: the host's own VLANs (tenant
	 * traffic never carries one), so its stack decides, as for any NIC. */
	if (skb->vlan_present) {
		count_forward(FWD_HOST_STACK);
		return TC_ACT_OK;
	}
	struct packet pkt = {};
	int reason = parse_packet(skb, &pkt);
	struct node_config *cfg = node_config();
	int learn;

	/* A TAP copy (the reserved flag, tap.h) goes to its monitors or
	 * nowhere, never down the tenant path; a node that taps nothing pays
	 * this one test of a header word. */
	if (!reason && pkt.ip && cfg && is_tap_copy(pkt.ip) && in_vm_space(cfg, pkt.ip->daddr))
		return tap_from_fabric(skb, &pkt, cfg);

	__u8 *to = pkt.eth->h_dest;
	if (!reason && pkt.ip && cfg && is_scope_mac(to)) {
		/* A farm or subnet broadcast: only a broadcast or multicast of the
		 * scope its MAC names, from a VM of that scope, sent by the host
		 * that holds it. */
		struct scope_key scope;
		struct iphdr *ip = pkt.ip;
		if (!scope_of(ip, &scope) || !scope_mac_is(to, &scope))
			return drop_packet(skb, &pkt, DROP_FABRIC_NOT_BROADCAST);
		if (!bpf_map_lookup_elem(&scopes, &scope))
			return drop_quietly(DROP_NO_MEMBERS); /* flooded past us: routine */
		reason = fabric_sender(cfg, ip->saddr, pkt.eth->h_source, &learn, &pkt);
		if (reason)
			return drop_packet(skb, &pkt, reason);
		if (learn)
			learn_mapping(ip->saddr, pkt.eth->h_source, packet_now(&pkt));
		delivery_mac(ip->daddr, pkt.eth->h_dest);
		virtual_mac(ip->saddr, pkt.eth->h_source);
		__be32 saddr = ip->saddr;
		__u8 proto = ip->protocol, ttl = ip->ttl;
		copy_to_members(skb, &scope, 0, saddr, ttl, proto, rule_port(&pkt), policy_gen(cfg->policy_epoch));
		return TC_ACT_SHOT; /* consumed: each member got its copy */
	}
	/* A question for a floating address this host holds (floating.h). */
	if (!reason && pkt.arp && cfg && feature_on(cfg, FEATURE_EGRESS) && !trace_mode) {
		int verdict = floating_arp(&pkt, cfg);
		if (verdict >= 0)
			return verdict;
	}
	if (!reason && pkt.arp && cfg && (in_vm_space(cfg, pkt.arp->spa) || in_vm_space(cfg, pkt.arp->tpa)))
		return handle_fabric_arp(skb, &pkt, cfg);
	if (reason || !pkt.ip || !cfg || !in_vm_space(cfg, pkt.ip->daddr)) {
		/* Not tenant IPv4: the host's stack decides, as for any NIC, but
		 * for what belongs to a sliver sharing its address. A node
		 * without slivers pays one test of a word already loaded. */
		if (!reason && pkt.ip && cfg && feature_on(cfg, FEATURE_EGRESS)) {
			int verdict = TC_ACT_SHOT; /* a VM's reply by its slice (egress.h) */
			int took = egress_in(skb, &pkt, &verdict);
			if (took == EGRESS_TAKEN)
				return verdict;
			if (took == EGRESS_FLOATING) {
				/* To a floating address: in a program of its own
				 * (uplink_floating), whose stack starts empty. */
				bpf_tail_call(skb, &floating_tail, 0);
				return drop_packet(skb, &pkt, DROP_NO_ROUTE); /* no uplink_floating in the array */
			}
		}
		if (!reason && cfg && feature_on(cfg, FEATURE_PORTSPACE))
			return portspace_from_fabric(skb, &pkt);
		count_forward(FWD_HOST_STACK);
		return TC_ACT_OK;
	}
	if (!mac_equal(pkt.eth->h_dest, cfg->uplink_mac)) {
		/* Flooded by the fabric towards another host; the stack discards
		 * it as PACKET_OTHERHOST, exactly as without onehop. */
		return TC_ACT_OK;
	}

	struct iphdr *ip = pkt.ip;
	reason = fabric_sender(cfg, ip->saddr, pkt.eth->h_source, &learn, &pkt);
	if (reason)
		return drop_packet(skb, &pkt, reason);
	struct endpoint *dst = bpf_map_lookup_elem(&endpoints, &ip->daddr);
	if (!dst)
		return drop_packet(skb, &pkt, DROP_FABRIC_NOT_LOCAL);
	/* Checked again on the receiving host: a sending host that skipped
	 * its check must not open the subnet. */
	reason = admit_fragments(&pkt, 0, dst->firewall, cfg->policy_epoch, ip->daddr);
	if (reason)
		return drop_packet(skb, &pkt, reason);
	if (learn)
		learn_mapping(ip->saddr, pkt.eth->h_source, packet_now(&pkt));

	mac_copy(pkt.eth->h_dest, dst->mac);
	if (same_subnet(ip->saddr, ip->daddr))
		virtual_mac(ip->saddr, pkt.eth->h_source);
	else /* the gateway illusion (paper §2) */
		virtual_mac(gateway_of(ip->daddr), pkt.eth->h_source);
	count_forward(FWD_FROM_FABRIC);
	return deliver_to_vif(skb, dst->ifindex, dst->kind, 0);
}
