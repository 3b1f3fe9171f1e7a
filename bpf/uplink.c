/* tcx ingress on the host's uplink: frames from the fabric. VM traffic
 * addressed to this host gets its virtual MACs back and goes straight into
 * the VM; anything outside the tenant address space is the host's own
 * management traffic (etcd, ARP between hosts) and goes to its stack. */
#include "lib/common.h"
#include "lib/maps.h"
#include "lib/parse.h"
#include "lib/drop.h"
#include "lib/route.h"
#include "lib/policy.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

SEC("tc")
int uplink_ingress(struct __sk_buff *skb)
{
	struct packet pkt = {};
	int reason = parse_packet(skb, &pkt);
	struct node_config *cfg = node_config();

	if (reason || !pkt.ip || !cfg || !in_vm_space(cfg, pkt.ip->daddr)) {
		/* Not tenant IPv4: the host's stack decides, as for any NIC. */
		count_forward(FWD_HOST_STACK);
		return TC_ACT_OK;
	}
	if (!mac_equal(pkt.eth->h_dest, cfg->uplink_mac)) {
		/* Flooded by the fabric towards another host; the stack discards
		 * it as PACKET_OTHERHOST, exactly as without onehop. */
		return TC_ACT_OK;
	}

	struct iphdr *ip = pkt.ip;
	struct endpoint *src = bpf_map_lookup_elem(&endpoints, &ip->saddr);
	if (!src || src->ifindex || !mac_equal(src->host_mac, pkt.eth->h_source))
		return drop_packet(skb, &pkt, DROP_FABRIC_UNKNOWN_SRC);
	struct endpoint *dst = bpf_map_lookup_elem(&endpoints, &ip->daddr);
	if (!dst || !dst->ifindex)
		return drop_packet(skb, &pkt, DROP_FABRIC_NOT_LOCAL);
	/* Checked again on the receiving host: a sending host that skipped
	 * its check must not open the subnet. */
	reason = admit(&pkt, 0, 1);
	if (reason)
		return drop_packet(skb, &pkt, reason);

	mac_copy(pkt.eth->h_dest, dst->mac);
	if (same_subnet(ip->saddr, ip->daddr))
		virtual_mac(ip->saddr, pkt.eth->h_source);
	else /* the gateway illusion (paper §2) */
		virtual_mac(gateway_of(ip->daddr), pkt.eth->h_source);
	count_forward(FWD_FROM_FABRIC);
	return bpf_redirect_peer(dst->ifindex, 0);
}
