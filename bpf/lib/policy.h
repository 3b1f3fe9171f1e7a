/* Who may talk to whom: visibility between subnets and farms (paper §2,
 * step 2) and each VM's own firewall. Inside a subnet everything is open
 * unless a VM's firewall says otherwise. Across subnets a packet passes if a
 * rule allows it, or if it answers a flow this host admitted. Both the
 * sending and the receiving host decide, each on its own conntrack, so
 * neither trusts the other. */
#ifndef ONEHOP_POLICY_H
#define ONEHOP_POLICY_H

#include "policy_maps.h"
#include "conntrack.h"
#include "csum.h"
#include "parse.h"
#include "route.h"
#include "share.h"
#include "icmp_error.h"
#include "observe.h"
#include "trace.h"

/* How long a first fragment's datagram is remembered (frag.h, and port
 * space's steering): a datagram's fragments leave back to back, so two
 * seconds is ample, and short enough that an IP id is not reused within it
 * at any sane rate. */
#define FRAG_LIFETIME_NS (2ULL * 1000000000ULL)

struct l4_ports {
	__be16 sport;
	__be16 dport;
	__u8 icmp_type;
	__u8 known; /* 0 for a non-first fragment or a truncated L4 header */
};

/* TCP/UDP ports, or the ICMP echo id as both ports (so a reply finds the
 * request's flow). */
static __always_inline struct l4_ports l4_of(const struct packet *pkt)
{
	struct l4_ports p = {};
	struct iphdr *ip = pkt->ip;
	if (ip->frag_off & bpf_htons(IP_OFFSET_MASK))
		return p;
	void *l4 = (void *)ip + (ip->ihl & 0xf) * 4;
	if (l4 + 8 > pkt->data_end)
		return p;
	if (ip->protocol == IPPROTO_TCP_ || ip->protocol == IPPROTO_UDP_) {
		__be16 *ports = l4;
		p.sport = ports[0];
		p.dport = ports[1];
		p.known = 1;
	} else if (ip->protocol == IPPROTO_ICMP_) {
		__u8 *icmp = l4;
		p.icmp_type = icmp[0];
		p.sport = p.dport = *(__be16 *)(icmp + 4);
		p.known = 1;
	}
	return p;
}

/* For an ICMP error, the flow of the packet it quotes (the quoted header
 * went from the error's destination to its source): that is the flow the
 * error is related to. Returns 0 when it is no error or cannot be read. */
static __always_inline int icmp_error_flow(const struct packet *pkt, __u8 type, struct flow *k)
{
	if (!is_icmp_error(type))
		return 0;
	struct iphdr *ip = pkt->ip;
	struct icmp_quote q;
	if (!icmp_quote_of((__u8 *)ip + (ip->ihl & 0xf) * 4, 0, pkt->data_end, &q))
		return 0;
	struct iphdr *inner = q.ip;
	/* Only the other end of the quoted flow may speak about it: a third
	 * party quoting someone else's flow gets nothing through. (The
	 * gateway's own errors are built on the host and never come here.) */
	if (inner->saddr != ip->daddr || inner->daddr != ip->saddr)
		return 0;
	__be16 *ports = (void *)q.l4;
	__builtin_memset(k, 0, sizeof(*k));
	k->saddr = inner->saddr;
	k->daddr = inner->daddr;
	k->proto = inner->protocol;
	if (inner->protocol == IPPROTO_ICMP_)
		k->sport = k->dport = ports[2]; /* the quoted echo's id */
	else {
		k->sport = ports[0];
		k->dport = ports[1];
	}
	return 1;
}

/* In the trace instance, records the visibility key that decided (hit:
 * enum trace_vis), as the agent compiled it: the controller names the rule
 * from it (internal/trace). Returns whether a key matched. Everything it
 * records is read from the key: keeping the packet's protocol and port
 * live across the lookups would cost the live program stack. */
static __always_inline int trace_vis(const struct vis_key *k, __u8 hit)
{
	if (trace_mode) {
		struct trace_record *t = trace_rec();
		if (t) {
			t->vis = hit;
			t->vis_gen = k->gen;
			t->src_farm = k->src_farm;
			t->src_subnet = k->src_subnet;
			t->dst_farm = k->dst_farm;
			t->dst_subnet = k->dst_subnet;
			t->vis_proto = k->proto;
			t->vis_port = k->port;
		}
	}
	return hit != TRACE_VIS_NONE;
}

/* A global function, like firewall_allows: checked once by the verifier,
 * not once per path through the broadcast loop that calls it. */
__attribute__((noinline)) int rule_allows(__be32 saddr, __be32 daddr, __u8 proto, __u16 port, __u8 gen)
{
	struct vis_key k = {
		.src_farm = farm_of(saddr),
		.src_subnet = subnet_of(saddr),
		.dst_farm = farm_of(daddr),
		.dst_subnet = subnet_of(daddr),
		.proto = proto,
		.gen = gen & 1,
		.port = port,
	};
	if (port && bpf_map_lookup_elem(&visibility, &k))
		return trace_vis(&k, TRACE_VIS_PORT);
	k.port = 0;
	if (bpf_map_lookup_elem(&visibility, &k))
		return trace_vis(&k, TRACE_VIS_PROTO);
	k.proto = 0;
	if (bpf_map_lookup_elem(&visibility, &k))
		return trace_vis(&k, TRACE_VIS_ANY);
	return trace_vis(&k, TRACE_VIS_NONE);
}

/* Records how a firewall decided (enum trace_fw), in the trace instance. */
static __always_inline int trace_fw(__u8 dir, __u8 how, __u32 index, int allow)
{
	if (trace_mode) {
		struct trace_record *t = trace_rec();
		if (t) {
			t->fw[dir & 1] = how;
			t->fw_index[dir & 1] = index;
			t->fw_allow[dir & 1] = allow;
		}
	}
	return allow;
}

/* A global function: the verifier checks its rule loop once, on its own,
 * instead of once per path through every caller (broadcast copies loop over
 * up to 32 members, each with its own firewall). */
/* A BPF call takes five arguments: the direction and the rule generation
 * travel in one byte. */
#define FW_SIDE(dir, gen) ((__u8)(((dir)&1) | (((gen)&1) << 1)))

__attribute__((noinline)) int firewall_allows(__be32 vm, __u8 side, __be32 remote, __u8 proto, __u16 port)
{
	__u8 dir = side & 1, gen = (side >> 1) & 1;
	struct fw_policy_key pk = {.vm = vm, .gen = gen};
	struct fw_policy *p = bpf_map_lookup_elem(&firewalls, &pk);
	if (!p)
		return 1;
	__u8 n = p->count[dir];
	for (__u8 i = 0; i < FW_MAX_RULES; i++) {
		if (i >= n)
			break;
		struct fw_key k = {.vm = vm, .dir = dir, .index = i, .gen = gen};
		struct fw_rule *r = bpf_map_lookup_elem(&firewall_rules, &k);
		if (!r) /* a rule the count promises is missing: refuse, never skip a deny */
			return trace_fw(dir, TRACE_FW_MISSING, i, 0);
		if ((remote & r->mask) != r->net)
			continue;
		if (r->proto && r->proto != proto)
			continue;
		if (r->port_lo && (port < r->port_lo || port > r->port_hi))
			continue;
		return trace_fw(dir, TRACE_FW_RULE, i, r->allow);
	}
	return trace_fw(dir, TRACE_FW_DEFAULT, 0, p->default_allow[dir]);
}

/* What the rules say about a flow from src to dst (proto, destination
 * port): visibility between their subnets, then the firewalls of the VMs
 * among them that live on this host and have one. */
static __always_inline int policy_allows(__be32 src, __be32 dst, __u8 proto, __u16 port, int fw_src, int fw_dst,
					 __u8 gen)
{
	if (!same_subnet(src, dst) && !rule_allows(src, dst, proto, port, gen))
		return DROP_NOT_VISIBLE;
	if (fw_src && !firewall_allows(src, FW_SIDE(FW_OUT, gen), dst, proto, port))
		return DROP_FIREWALL_OUT;
	if (fw_dst && !firewall_allows(dst, FW_SIDE(FW_IN, gen), src, proto, port))
		return DROP_FIREWALL_IN;
	return DROP_NONE;
}

/* The destination port rules match on for a flow's opening direction. */
static __always_inline __u16 flow_port(__u8 proto, __be16 dport)
{
	return (proto == IPPROTO_TCP_ || proto == IPPROTO_UDP_) ? bpf_ntohs(dport) : 0;
}

/* Checks again an admitted flow (e) whose packet goes its way (way: the
 * direction it was opened, the packet's dir or the other), called when the
 * rules changed since it was last checked (epoch) or it was cut: against
 * the rules in force, the way it was opened, from the opener's source to
 * its destination. One no longer allowed is cut, both ways, and counted
 * once, as DROP_REVOKED; its later packets are refused for the reason the
 * rules give until they admit it again that way. Were they judged on their
 * own instead, a reply the new rules let open a flow of its own (a VM's
 * outbound default allow) would bring the flow back, and its opener's
 * packets with it as answers. A cut entry is never touched, so it ages
 * out. A function of its own: inlined in admit, its two policy checks made
 * the router's programs need more stack than BPF gives (512 bytes). */
#define CT_ARGS(way, dir, fw_src, fw_dst) \
	((__u32)(way) | ((__u32)(dir) << 2) | ((__u32)((fw_src) != 0) << 4) | ((__u32)((fw_dst) != 0) << 5))

static __attribute__((noinline)) int ct_recheck(struct ct_entry *e, const struct flow *f, __u32 epoch, __u32 args)
{
	__u8 way = args & 3, dir = (args >> 2) & 3, gen = policy_gen(epoch);
	int fw_src = (args >> 4) & 1, fw_dst = (args >> 5) & 1;
	int reason = way == dir ? policy_allows(f->saddr, f->daddr, f->proto, flow_port(f->proto, f->dport), fw_src, fw_dst, gen)
				: policy_allows(f->daddr, f->saddr, f->proto, flow_port(f->proto, f->sport), fw_dst, fw_src, gen);
	if (reason) {
		if (e->opened & CT_CUT)
			return reason;
		if (!trace_mode)
			e->opened |= CT_CUT;
		return DROP_REVOKED;
	}
	if (!trace_mode) {
		e->opened = way; /* only the way just checked is vouched for now */
		e->epoch = epoch;
	}
	return DROP_NONE;
}

/* admit decides whether a packet from src to dst may be delivered: the
 * visibility rules between their subnets (paper §2, step 2) and the
 * firewalls of the VMs among them that live on this host and have one
 * (fw_src, fw_dst: the flags in their vif_info/endpoint entries), all from
 * the rule generation of epoch. A packet of a flow this host admitted, in
 * the flow's direction or answering it, passes on one lookup (the flow's
 * one entry, conntrack.h), unless the rules changed since (epoch): then the
 * flow is checked again, in the direction it was opened; one no longer
 * allowed is cut, both ways, and counted once as DROP_REVOKED. An admitted packet that can open a flow is remembered,
 * out of owner's share. Traffic inside a subnet between VMs without
 * firewalls takes no lookup at all. */
static __always_inline int admit(struct packet *pkt, int fw_src, int fw_dst, __u32 epoch, __be32 owner)
{
	struct iphdr *ip = pkt->ip;
	int crossing = !same_subnet(ip->saddr, ip->daddr);
	if (!crossing && !fw_src && !fw_dst)
		return DROP_NONE;

	__u8 gen = policy_gen(epoch);
	struct l4_ports l4 = l4_of(pkt);
	__u64 now = packet_now(pkt);
	/* What this packet may do with a flow. TCP/UDP open flows and answer
	 * them. For ICMP only an echo request opens one and only an echo reply
	 * answers (an echo request reusing a reply's id must not pass as one);
	 * an error answers the flow it quotes. A non-first fragment does
	 * neither: only a rule for the whole protocol lets it through. */
	int is_icmp = ip->protocol == IPPROTO_ICMP_;
	int opens = l4.known && !(is_icmp && l4.icmp_type != ICMP_ECHO_REQUEST);
	int answers = l4.known && !(is_icmp && l4.icmp_type != ICMP_ECHO_REPLY);
	struct flow f = {
		.saddr = ip->saddr,
		.daddr = ip->daddr,
		.sport = l4.sport,
		.dport = l4.dport,
		.proto = ip->protocol,
	};
	struct flow quoted;
	if (l4.known && is_icmp && icmp_error_flow(pkt, l4.icmp_type, &quoted)) {
		/* The quoted packet went from this packet's destination to its
		 * source: this packet goes the other way in the quoted flow. */
		f.saddr = quoted.daddr;
		f.daddr = quoted.saddr;
		f.sport = quoted.dport;
		f.dport = quoted.sport;
		f.proto = quoted.proto;
		answers = 1;
	}
	struct ct_key k;
	__u8 dir = ct_key_of(&f, &k);
	__u8 back = dir ^ CT_OPENED_BOTH;
	struct ct_entry *e = (opens || answers) ? bpf_map_lookup_elem(&conntrack, &k) : 0;
	if (e && ct_live(e, now)) {
		/* Going the way the flow was opened, or answering it. */
		__u8 way = 0;
		if (opens && (e->opened & dir))
			way = dir;
		else if (answers && (e->opened & back))
			way = back;
		if (way && (e->epoch != epoch || (e->opened & CT_CUT))) {
			if (trace_mode)
				trace_ct(TRACE_CT_RECHECKED);
			int reason = ct_recheck(e, &f, epoch, CT_ARGS(way, dir, fw_src, fw_dst));
			if (reason)
				return reason;
		}
		if (way) {
			if (trace_mode && !(e->epoch != epoch || (e->opened & CT_CUT)))
				trace_ct(way == dir ? TRACE_CT_ESTABLISHED : TRACE_CT_REPLY);
			ct_touch(e, now);
			return DROP_NONE;
		}
	}
	if (trace_mode)
		trace_ct(TRACE_CT_NEW);
	__u16 port = opens ? flow_port(ip->protocol, l4.dport) : 0;
	int reason = policy_allows(ip->saddr, ip->daddr, ip->protocol, port, fw_src, fw_dst, gen);
	if (reason)
		return reason;
	if (!opens)
		return DROP_NONE;
	/* A new entry comes out of the local VM's share (the sender on its vif,
	 * the receiver from the fabric): a VM opening flows as fast as it can
	 * cannot churn the others' flows out of the table. An entry opened the
	 * other way already is no new entry. */
	if (!e && !share_take(owner, SHARE_FLOWS, now))
		return DROP_OVER_SHARE;
	ct_open(&k, e, dir, epoch, now);
	if (!trace_mode) /* onehop observe: a new flow, while someone observes */
		observe_flow(&f, owner);
	return DROP_NONE;
}

/* One hop through the virtual gateway: TTL down by one, checksum patched
 * incrementally (TTL is the high byte of its 16-bit word, so the word goes
 * down by 0x0100). */
static __always_inline int take_gateway_hop(struct iphdr *ip)
{
	if (ip->ttl <= 1)
		return DROP_TTL_EXCEEDED;
	csum_word_decreased(&ip->check, bpf_htons(0x0100));
	ip->ttl--;
	return DROP_NONE;
}

/* Answers an echo request to the VM's own gateway in place. Returns 1 when
 * the packet became the reply. */
static __always_inline int answer_gateway_ping(struct packet *pkt)
{
	struct iphdr *ip = pkt->ip;
	if (ip->protocol != IPPROTO_ICMP_ || ip->daddr != gateway_of(ip->saddr))
		return 0;
	if (ip->frag_off & bpf_htons(IP_OFFSET_MASK | IP_MF))
		return 0;
	__u8 *icmp = (void *)ip + (ip->ihl & 0xf) * 4;
	if ((void *)icmp + 4 > pkt->data_end || icmp[0] != ICMP_ECHO_REQUEST || icmp[1] != 0)
		return 0;
	/* Type 8 -> 0: the word {type, code} goes down by 0x0800. */
	icmp[0] = ICMP_ECHO_REPLY;
	csum_word_decreased((__sum16 *)(icmp + 2), bpf_htons(0x0800));
	__be32 gw = ip->daddr;
	ip->daddr = ip->saddr;
	ip->saddr = gw; /* swapping addresses leaves the IP checksum as it was */
	mac_copy(pkt->eth->h_dest, pkt->eth->h_source);
	virtual_mac(gw, pkt->eth->h_source);
	return 1;
}

#endif
