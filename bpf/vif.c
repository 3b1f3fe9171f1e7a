/* tcx ingress on a guest vif (egress on a macvtap): every frame a VM sends
 * passes here first.
 * Order follows the paper's Figure 3: anti-spoof, visibility and firewalls,
 * mapping-table lookup, MAC rewrite, then straight to the destination —
 * the peer vif on this host or the uplink towards the holding host; a
 * destination not yet in the table waits in the agent for the ARP engine. */
#include "lib/common.h"
#include "lib/maps.h"
#include "lib/parse.h"
#include "lib/drop.h"
#include "lib/antispoof.h"
#include "lib/arp.h"
#include "lib/route.h"
#include "lib/policy.h"
#include "lib/slowpath.h"
#include "lib/icmp_error.h"
#include "lib/broadcast.h"
#include "lib/mapping.h"
#include "lib/redirect.h"
#include "lib/frag.h"
#include "lib/tap.h"
#include "lib/vnat_service.h"
#include "lib/egress.h"
/* Not used here: its maps are defined with the rest, so every program
 * shares them by name (internal/datapath). */
#include "lib/portspace_maps.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* Types only the Go side reads (ring-buffer records, counter indexes): these
 * references put them in BTF so bpf2go -type can generate their Go twins. */
const struct observe_event *_observe_event_type __attribute__((unused));
const enum observe_kind *_observe_kind_type __attribute__((unused));
const struct observe_limits *_observe_limits_type __attribute__((unused));
const struct observe_bucket *_observe_bucket_type __attribute__((unused));
const enum drop_reason *_drop_reason_type __attribute__((unused));
const enum forward_path *_forward_path_type __attribute__((unused));
const struct slowpath_event *_slowpath_event_type __attribute__((unused));
const enum slowpath_kind *_slowpath_kind_type __attribute__((unused));
const enum share_kind *_share_kind_type __attribute__((unused));
const enum feature_bit *_feature_bit_type __attribute__((unused));
const enum vif_kind *_vif_kind_type __attribute__((unused));
const enum guest_mark *_guest_mark_type __attribute__((unused));

/* A VM's packet to an address outside the tenant space, which vif_ingress
 * has judged (anti-spoofing, DHCP, the VNAT service, ARP, broadcast) and
 * hands on by a tail call: egress_out inlined or called from vif_ingress
 * would add to the frame of a program whose deepest call chain (a TAP
 * copy) is within bytes of BPF's 512-byte stack; a tail call's program
 * starts with a stack of its own. Only egress_tail reaches it: nothing
 * attaches it. */
SEC("tc")
int vif_egress(struct __sk_buff *skb)
{
	struct packet pkt = {};
	int reason = parse_packet(skb, &pkt);
	__u32 ifindex = skb->ifindex;
	struct vif_info *vif = bpf_map_lookup_elem(&vifs, &ifindex);
	struct node_config *cfg = node_config();
	if (reason || !pkt.ip || !vif || !cfg)
		return drop_packet(skb, &pkt, reason ? reason : DROP_NO_ROUTE);
	return egress_out(skb, &pkt, vif, cfg->policy_epoch);
}

/* vif_ingress's way into vif_egress. Not pinned: each loaded instance (the
 * live one, a trace's) has its own, filled by the loader. */
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
	__array(values, int(struct __sk_buff *));
} egress_tail SEC(".maps") = {
	.values = {[0] = (void *)&vif_egress},
};

/* Every frame a guest sends. On a veth or a tap that is the vif's ingress;
 * on a macvtap it is its egress, since what the guest writes to the
 * macvtap's fd is sent by the device (tap_get_user: dev_queue_xmit), and
 * a frame for the guest enters the device's ingress instead
 * (deliver_to_vif). */
SEC("tc")
int vif_ingress(struct __sk_buff *skb)
{
	struct packet pkt = {};
	int reason = parse_packet(skb, &pkt);
	/* A VLAN tag the vif took out of the frame (veths offload it): it would
	 * leave the uplink with the VM's VLAN and priority on the underlay. */
	if (skb->vlan_present)
		reason = DROP_VLAN_TAGGED;
	/* The fabric's copy marker (tap.h): no VM may forge a copy, whether or
	 * not this node taps anything. */
	if (!reason && pkt.ip && is_tap_copy(pkt.ip))
		reason = DROP_RESERVED_FLAG;
	if (reason)
		return drop_packet(skb, &pkt, reason);

	__u32 ifindex = skb->ifindex;
	struct vif_info *vif = bpf_map_lookup_elem(&vifs, &ifindex);
	if (!vif)
		return drop_packet(skb, &pkt, DROP_UNKNOWN_VIF);
	/* Only on a macvtap's egress: the agent's own frame for the guest (a
	 * DHCP answer, from its marked packet socket), on its way in. */
	if (skb->mark == GUEST_MARK && vif->kind == VIF_MACVTAP)
		return deliver_in_guest(skb, ifindex);
	/* A DHCP client has no address yet (source 0.0.0.0), so only its MAC
	 * is checked; the agent answers with the VM's own address anyway. */
	int dhcp = dhcp_class(&pkt);
	if (dhcp == DHCP_CLIENT) {
		if (!mac_equal(pkt.eth->h_source, vif->mac))
			return drop_packet(skb, &pkt, DROP_SPOOFED_MAC);
		if (!share_take(vif->ip, SHARE_PUNTS, packet_now(&pkt)))
			return drop_packet(skb, &pkt, DROP_OVER_SHARE);
		return punt_to_agent(skb, &pkt, SLOW_DHCP);
	}
	reason = check_source(&pkt, vif);
	if (reason)
		return drop_packet(skb, &pkt, reason);
	if (dhcp == DHCP_ROGUE)
		return drop_packet(skb, &pkt, DROP_ROGUE_DHCP);

	struct node_config *cfg = node_config();
	/* The VNAT location service, to the host's stack (vnat_service.h): the
	 * frame is for the gateway's MAC, so it is made the host's own. */
	if (cfg && feature_on(cfg, FEATURE_VNAT_LOCATION) && to_location_service(&pkt)) {
		/* Passed on, a macvtap's frame would leave by its lower device. */
		if (vif->kind == VIF_MACVTAP)
			return drop_packet(skb, &pkt, DROP_MACVTAP_NO_STACK);
		if (!share_take(vif->ip, SHARE_PUNTS, packet_now(&pkt)))
			return drop_packet(skb, &pkt, DROP_OVER_SHARE);
		bpf_skb_change_type(skb, PACKET_HOST_);
		count_forward(FWD_VNAT_LOCATION);
		return TC_ACT_OK;
	}
	if (pkt.arp) {
		if (vif->kind == VIF_MACVTAP)
			skb->mark = GUEST_MARK; /* harmless on a frame that is dropped or leaves the host */
		int to_fabric = 0;
		reason = handle_vm_arp(&pkt, cfg, &to_fabric);
		if (reason)
			return drop_packet(skb, &pkt, reason);
		if (to_fabric && cfg) {
			count_forward(FWD_ARP_TO_FABRIC);
			return redirect_out(cfg->uplink_ifindex);
		}
		count_forward(FWD_ARP_REPLY);
		/* Egress of the same vif delivers the reply to the asking VM; on a
		 * macvtap, marked above, this program takes it in on a second
		 * pass (reply_to_vif here would need a stack slot more than the
		 * program has). */
		return redirect_out(ifindex);
	}

	struct iphdr *ip = pkt.ip;
	if (!ip) /* parse_packet guarantees it; the verifier cannot know */
		return drop_packet(skb, &pkt, DROP_MALFORMED);
	if (answer_gateway_ping(&pkt)) {
		count_forward(FWD_GATEWAY_REPLY);
		return reply_to_vif(skb, ifindex, vif->kind);
	}
	if (!cfg) /* the agent has not configured this node yet */
		return drop_packet(skb, &pkt, DROP_NO_UPLINK);
	struct scope_key scope;
	if (scope_of(ip, &scope)) {
		__be32 saddr = ip->saddr;
		__u8 proto = ip->protocol, ttl = ip->ttl;
		__u16 port = rule_port(&pkt);
		__u8 gen = policy_gen(cfg->policy_epoch);
		if (vif->firewall && !firewall_allows(saddr, FW_SIDE(FW_OUT, gen), ip->daddr, proto, port))
			return drop_packet(skb, &pkt, DROP_FIREWALL_OUT);
		copy_to_members(skb, &scope, ifindex, saddr, ttl, proto, port, gen);
		/* And one copy onto the fabric, to the scope's multicast address:
		 * the hosts with VMs there take it from there. */
		if (!cfg->uplink_ifindex)
			return drop_quietly(DROP_NO_UPLINK);
		struct ethhdr *eth = (void *)(long)skb->data;
		if ((void *)(eth + 1) > (void *)(long)skb->data_end)
			return drop_quietly(DROP_MALFORMED);
		scope_mac(&scope, eth->h_dest);
		mac_copy(eth->h_source, cfg->uplink_mac);
		count_forward(FWD_TO_FABRIC);
		return redirect_out(cfg->uplink_ifindex);
	}
	if (!in_vm_space(cfg, ip->daddr)) {
		if (!feature_on(cfg, FEATURE_EGRESS))
			return drop_packet(skb, &pkt, DROP_NO_ROUTE);
		/* egress.h claims ports and keeps its own counters: a trace
		 * stops at its door rather than spend a slice's port. */
		if (trace_mode) {
			trace_forward(FWD_EGRESS_OUT);
			return TC_ACT_SHOT;
		}
		/* Through its host's address (egress.h), in a program of its
		 * own: its stack then starts empty (see vif_egress). */
		bpf_tail_call(skb, &egress_tail, 0);
		return drop_packet(skb, &pkt, DROP_NO_ROUTE); /* no vif_egress in the array */
	}
	/* A subnet's network (.0) or gateway (.1) address, which no VM holds
	 * (the gateway only answers ping). */
	__u32 host_id = host_of(ip->daddr);
	if (host_id == 0 || host_id == 1)
		return drop_packet(skb, &pkt, DROP_NO_ROUTE);
	struct endpoint *local = bpf_map_lookup_elem(&endpoints, &ip->daddr);
	reason = admit_fragments(&pkt, vif->firewall, local && local->firewall, cfg->policy_epoch, vif->ip);
	if (reason)
		return drop_packet(skb, &pkt, reason);
	int routed = !same_subnet(ip->saddr, ip->daddr);
	if (routed) {
		/* The one hop the sender sees: its gateway (decremented once, here). */
		reason = take_gateway_hop(ip);
		if (reason) {
			/* Tell the sender, as a router would: traceroute's first hop. */
			if (make_time_exceeded(skb, vif->mac) == 0) {
				count_forward(FWD_GATEWAY_REPLY);
				return reply_to_vif(skb, ifindex, vif->kind);
			}
			/* The frame may be half rebuilt: log no headers. */
			struct packet rebuilt = {};
			return drop_packet(skb, &rebuilt, reason);
		}
		count_forward(FWD_ROUTED);
	}

	if (local) {
		mac_copy(pkt.eth->h_dest, local->mac);
		if (routed) /* the gateway illusion: it arrives from the gateway */
			virtual_mac(gateway_of(ip->daddr), pkt.eth->h_source);
		count_forward(FWD_LOCAL);
		/* Its copies, once its verdict is decided: production goes by
		 * redirect_peer, past every backlog, so it waits for none. */
		if (feature_on(cfg, FEATURE_TAP))
			tap_copy(skb, cfg, packet_now(&pkt));
		/* Straight into the receiving VM (its namespace, for a veth: skips a
		 * backlog pass). */
		/* On a macvtap this program runs on its egress (see above). */
		return deliver_to_vif(skb, local->ifindex, local->kind, vif->kind == VIF_MACVTAP);
	}

	if (!cfg->uplink_ifindex)
		return drop_packet(skb, &pkt, DROP_NO_UPLINK);
	/* No virtual MAC on the wire (paper §2): host MAC to host MAC. */
	mac_copy(pkt.eth->h_source, cfg->uplink_mac);
	struct mapping *remote = mapping_for_send(ip->daddr, packet_now(&pkt));
	if (!remote) {
		/* Paper §2 step 6: queued until the ARP engine finds the host.
		 * The frame is complete but for its destination MAC. */
		int held = may_hold(ip->daddr, vif->ip, packet_now(&pkt));
		if (held == HOLD_OVER_SHARE)
			return drop_packet(skb, &pkt, DROP_OVER_SHARE);
		if (!held)
			return drop_packet(skb, &pkt, DROP_UNRESOLVED);
		if (!share_take(vif->ip, SHARE_PUNTS, packet_now(&pkt)))
			return drop_packet(skb, &pkt, DROP_OVER_SHARE);
		if (feature_on(cfg, FEATURE_TAP)) {
			tap_copy(skb, cfg, packet_now(&pkt));
			parse_packet(skb, &pkt); /* the copies made the pointers stale */
		}
		return punt_to_agent(skb, &pkt, SLOW_HOLD);
	}
	mac_copy(pkt.eth->h_dest, remote->host_mac);
	count_forward(FWD_TO_FABRIC);
	/* Copied: production is sent first, then its copies (tap_copy). */
	if (feature_on(cfg, FEATURE_TAP) && tap_copy_first(skb, cfg, packet_now(&pkt)))
		return TC_ACT_STOLEN;
	return redirect_out(cfg->uplink_ifindex);
}

/* tcx ingress on a macvtap guest's vif. Its lower device hands the guest
 * frames of its own, past the datapath: the macvlan rx path
 * (macvlan_handle_frame) delivers every unicast frame for the macvtap's MAC
 * and a copy of every broadcast and multicast from the wire, in every mode,
 * and in bridge mode the frames of the lower device's other macvlans. Each
 * of them enters the macvtap here, before its fd takes it
 * (__netif_receive_skb_core runs tcx ingress before the rx_handler,
 * tap_handle_frame). Only what the datapath delivered, marked, passes. */
SEC("tc")
int vif_macvtap_guard(struct __sk_buff *skb)
{
	if (skb->mark == GUEST_MARK) {
		skb->mark = 0; /* the guest's own frames start unmarked again */
		return TC_ACT_OK;
	}
	/* Routine on a real host (every broadcast on the wire comes here):
	 * counted, not logged. */
	return drop_quietly(DROP_MACVTAP_BYPASS);
}
