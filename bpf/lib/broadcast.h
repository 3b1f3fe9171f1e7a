/* Scoped broadcast and multicast (paper §2, "Virtual IP broadcast and IP
 * multicast"): a VM's broadcast reaches the VMs of its subnet, IP multicast
 * with TTL 1 those of its subnet and with TTL > 1 those of its farm, on any
 * host, and nobody else. On the fabric each scope is one Ethernet multicast
 * address, 03:F:0a:f:s:S (s = 0 for the farm; f, s the low bytes of the
 * farm and subnet ids, F, S their high bytes, so 03:00:0a:f:s:00 in the
 * default 8/8/8 plan): locally administered, never a VM's, so only hosts
 * that have a VM there bother with it. internal/addrplan.ScopeMAC is the
 * same. */
#ifndef ONEHOP_BROADCAST_H
#define ONEHOP_BROADCAST_H

#include "broadcast_maps.h"
#include "drop.h"
#include "policy.h"
#include "redirect.h"

static __always_inline int is_ip_multicast(__be32 a)
{
	return (bpf_ntohl(a) & 0xf0000000) == 0xe0000000;
}

/* The scope a VM's packet to daddr is meant for; 0 when it is not one. */
static __always_inline int scope_of(const struct iphdr *ip, struct scope_key *k)
{
	__be32 d = ip->daddr;
	__builtin_memset(k, 0, sizeof(*k));
	k->farm = farm_of(ip->saddr);
	if (d == 0xffffffff || (same_subnet(d, ip->saddr) && is_subnet_broadcast(d))) {
		k->subnet = subnet_of(ip->saddr);
		return 1;
	}
	if (is_ip_multicast(d)) {
		k->subnet = ip->ttl > 1 ? 0 : subnet_of(ip->saddr);
		return 1;
	}
	return 0;
}

static __always_inline void scope_mac(const struct scope_key *k, __u8 *mac)
{
	mac[0] = 0x03;
	mac[1] = k->farm >> 8;
	mac[2] = 10;
	mac[3] = k->farm;
	mac[4] = k->subnet;
	mac[5] = k->subnet >> 8;
}

static __always_inline int is_scope_mac(const __u8 *m)
{
	return m[0] == 0x03 && m[2] == 10;
}

/* The scope a scope MAC names (is_scope_mac already true). */
static __always_inline int scope_mac_is(const __u8 *m, const struct scope_key *k)
{
	return k->farm == ((__u16)m[1] << 8 | m[3]) && k->subnet == ((__u16)m[5] << 8 | m[4]);
}

/* What a VM expects as destination MAC: broadcast, or the IPv4 multicast MAC. */
static __always_inline void delivery_mac(__be32 daddr, __u8 *mac)
{
	const __u8 *d = (const __u8 *)&daddr;
	if (is_ip_multicast(daddr)) {
		mac[0] = 0x01;
		mac[1] = 0x00;
		mac[2] = 0x5e;
		mac[3] = d[1] & 0x7f;
		mac[4] = d[2];
		mac[5] = d[3];
	} else {
		__builtin_memset(mac, 0xff, ETH_ALEN);
	}
}

/* Rewrites the IPv4 TTL of the frame in skb (checksum patched). */
static __always_inline int set_ttl(struct __sk_buff *skb, __u8 ttl)
{
	__u8 word[2];
	if (bpf_skb_load_bytes(skb, ETH_HLEN + 8, word, 2) < 0)
		return -1;
	__be16 old = *(__be16 *)word;
	word[0] = ttl;
	__be16 new = *(__be16 *)word;
	if (bpf_l3_csum_replace(skb, ETH_HLEN + 10, old, new, 2) < 0)
		return -1;
	return bpf_skb_store_bytes(skb, ETH_HLEN + 8, word, 1, 0);
}

/* What one walk over a scope's members needs: bpf_loop hands it to
 * copy_member for each index. */
struct copy_walk {
	struct __sk_buff *skb;
	struct member_key key;
	__u32 skip_ifindex;
	__be32 saddr;
	__u16 port;
	__u8 proto;
	__u8 gen;
	__u8 routed_pass;   /* 0: the sender's subnet; 1: other subnets, TTL already lowered */
	__u8 other_subnets; /* set by pass 0: a member of another subnet was seen */
};

/* One member: its copy, its own firewall and (across subnets) the farm's
 * rules permitting. A bpf_loop callback, so the verifier checks it once
 * however many members a scope has. Returns 0: go on with the next one. */
static long copy_member(__u32 index, void *ctx)
{
	struct copy_walk *w = ctx;
	w->key.index = index;
	struct scope_member *m = bpf_map_lookup_elem(&scope_members, &w->key);
	if (!m)
		return 0; /* removed meanwhile: the count is read before the members */
	__u32 ifindex = m->ifindex;
	__be32 vm = m->ip;
	if (!ifindex || ifindex == w->skip_ifindex)
		return 0;
	int same = same_subnet(vm, w->saddr);
	if (!w->routed_pass && !same) {
		w->other_subnets = 1;
		return 0;
	}
	if (w->routed_pass && same)
		return 0;
	if (!firewall_allows(vm, FW_SIDE(FW_IN, w->gen), w->saddr, w->proto, w->port))
		return 0;
	if (!same) {
		/* Farm-wide multicast crosses subnets only where the farm's rules
		 * let the sender's subnet reach the member's, and arrives as a
		 * router hands it over: from the member's gateway's MAC. */
		if (!rule_allows(w->saddr, vm, w->proto, w->port, w->gen))
			return 0;
		__u8 gw_mac[ETH_ALEN];
		virtual_mac(gateway_of(vm), gw_mac);
		if (bpf_skb_store_bytes(w->skb, ETH_ALEN, gw_mac, ETH_ALEN, 0) < 0)
			return 1;
	}
	if (clone_to(w->skb, &m->ifindex) == 0)
		count_forward(FWD_BROADCAST);
	return 0;
}

/* Copies the packet to every local VM of the scope but skip_ifindex, each
 * VM's own firewall permitting (rule generation gen). A VM of another
 * subnet than the sender's (a farm-wide multicast) gets its copy as a
 * router would hand it over: TTL one less, from its own gateway's MAC. The
 * frame is left as it came. The caller's packet pointers are stale
 * afterwards. */
static __always_inline void copy_to_members(struct __sk_buff *skb, const struct scope_key *k, __u32 skip_ifindex,
					    __be32 saddr, __u8 ttl, __u8 proto, __u16 port, __u8 gen)
{
	struct scope_info *info = bpf_map_lookup_elem(&scopes, k);
	if (!info || trace_mode) /* a copy is sent at once, even from BPF_PROG_RUN */
		return;
	__u32 n = info->count;
	if (n > MAX_SCOPE_MEMBERS)
		n = MAX_SCOPE_MEMBERS;
	struct copy_walk w = {
		.skb = skb,
		.key = {.farm = k->farm, .subnet = k->subnet},
		.skip_ifindex = skip_ifindex,
		.saddr = saddr,
		.port = port,
		.proto = proto,
		.gen = gen,
	};
	bpf_loop(n, copy_member, &w, 0);
	if (!w.other_subnets || ttl <= 1)
		return;
	/* The second pass: the members of other subnets, with the TTL one
	 * less; then the frame goes on (to the fabric) as it came. */
	__u8 saved_src[ETH_ALEN];
	if (bpf_skb_load_bytes(skb, ETH_ALEN, saved_src, ETH_ALEN) < 0 || set_ttl(skb, ttl - 1) < 0)
		return;
	w.routed_pass = 1;
	bpf_loop(n, copy_member, &w, 0);
	bpf_skb_store_bytes(skb, ETH_ALEN, saved_src, ETH_ALEN, 0);
	set_ttl(skb, ttl);
}

/* The destination port rules match on; 0 for ICMP and fragments. */
static __always_inline __u16 rule_port(const struct packet *pkt)
{
	struct l4_ports l4 = l4_of(pkt);
	if (!l4.known || pkt->ip->protocol == IPPROTO_ICMP_)
		return 0;
	return bpf_ntohs(l4.dport);
}

#endif
