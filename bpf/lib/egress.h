/* North-south egress (docs/north-south.md): a VM reaches addresses outside
 * the tenant space through its own host. Its packets leave the uplink with
 * the host's address and a source port (or ICMP echo id) of the VM's own
 * slice of that address's ports; replies are steered back by destination
 * port, one array lookup (egress_ports, as port space's, paper 000 §3), and
 * un-translated. A port holds at most one flow, so a VM's translations are
 * bounded by its slice: a VM that opens flows as fast as it can fills its
 * own slice and is refused, never another VM's (no shared LRU to evict:
 * cilium#29305, #31643), and slices are leases of the address, never the
 * host's ephemeral ports (cilium#34041).
 *
 * Called from vif.c (a VM's packet outside the tenant space) and uplink.c
 * (a packet to a host address), only where FEATURE_EGRESS is on (a node
 * with an egress VM or a published port). Published ports are publish.h's,
 * hooked in here. */
#ifndef ONEHOP_EGRESS_H
#define ONEHOP_EGRESS_H

#include "common.h"
#include "parse.h"
#include "drop.h"
#include "route.h"
#include "policy.h"
#include "broadcast.h"
#include "redirect.h"
#include "icmp_error.h"
#include "endpoint_maps.h"
#include "egress_maps.h"

/* egress_in's answers: not a packet of egress (the caller goes on as
 * before), or taken (its verdict is the program's). A constant, so the
 * verifier sees that a packet whose pointers a rewrite invalidated never
 * goes on. */
#define EGRESS_PASS 0
#define EGRESS_TAKEN 1
#define EGRESS_FLOATING 2 /* for a floating address (floating.h): the caller's to hand on */
/* Ports tried for a new flow, in turn from just past the VM's last claim
 * (egress_cursors): the oldest claims come first, so a slice whose flows
 * expire in order refuses only when it is truly full; one whose old flows
 * live on may refuse while a port further on is free (a refusal, the VM's
 * only). */
#define EGRESS_PROBES 32
/* A translation's flags: what its flow has shown. */
#define EGRESS_REPLIED 1      /* something came back */
#define EGRESS_FIN_OUT 2      /* the VM sent a FIN */
#define EGRESS_FIN_IN 4       /* the remote sent a FIN */
#define EGRESS_REMOTE_FIRST 8 /* ... before the VM did: the remote end keeps TIME_WAIT */
#define EGRESS_RST 16         /* either end sent a RST */
#define EGRESS_NEW 32         /* (only in set) a SYN of the VM's: a new connection on the tuple */
#define EGRESS_DONE 64        /* the remote closed first and has acked the VM's FIN */
#define EGRESS_FRAG_OUT 1
#define EGRESS_FRAG_IN 2

/* Timeouts (docs/north-south.md): a translation idle longer frees its
 * port. TCP as RFC 5382 asks of a NAT (established: 2 h 4 min), UDP as
 * RFC 4787 (at least 2 min once answered). A closed connection frees its
 * port soon: when the VM closed first the remote end keeps no TIME_WAIT;
 * when the remote did, a new flow of the same VM on the port to the same
 * remote end reopens its TIME_WAIT (RFC 6191: the SYN's timestamp is newer,
 * since Linux gives one source and destination pair one timestamp clock),
 * and a flow to another remote end does not meet it at all. */
#define EGRESS_SEC 1000000000ULL
#define EGRESS_TCP_OPENING_NS (60 * EGRESS_SEC)
#define EGRESS_TCP_ESTABLISHED_NS (7440 * EGRESS_SEC)
#define EGRESS_TCP_HALF_CLOSED_NS (120 * EGRESS_SEC)
#define EGRESS_TCP_CLOSED_NS (2 * EGRESS_SEC)
#define EGRESS_TCP_TIME_WAIT_NS (2 * EGRESS_SEC)
/* Closed and done (EGRESS_DONE): the remote closed first, the VM then
 * closed, and the remote's ACK of the VM's FIN has come back through the
 * translation. The VM's socket is gone and the remote is in TIME_WAIT:
 * nothing of the connection has to cross any more, so the port is free at
 * once. (When the VM closed first the remote sits in LAST_ACK until the
 * VM's last ACK reaches it, and its FIN, resent if that ACK is lost, must
 * still reach the VM: that case keeps EGRESS_TCP_CLOSED_NS.) */
#define EGRESS_TCP_DONE_NS 0
#define EGRESS_UDP_NS (30 * EGRESS_SEC)
#define EGRESS_UDP_REPLIED_NS (120 * EGRESS_SEC)
#define EGRESS_ICMP_NS (30 * EGRESS_SEC)

#define TCP_FLAG_FIN 0x01
#define TCP_FLAG_SYN 0x02
#define TCP_FLAG_RST 0x04
#define TCP_FLAG_ACK 0x10

static __always_inline struct egress_counters *egress_counters_of(__u32 slot)
{
	return bpf_map_lookup_elem(&egress_stats, &slot);
}

static __always_inline __u64 egress_timeout(__u8 proto, __u32 flags)
{
	if (proto == IPPROTO_TCP_) {
		if (flags & EGRESS_DONE)
			return EGRESS_TCP_DONE_NS;
		if (flags & EGRESS_RST)
			return EGRESS_TCP_CLOSED_NS;
		if ((flags & (EGRESS_FIN_OUT | EGRESS_FIN_IN)) == (EGRESS_FIN_OUT | EGRESS_FIN_IN))
			return (flags & EGRESS_REMOTE_FIRST) ? EGRESS_TCP_TIME_WAIT_NS : EGRESS_TCP_CLOSED_NS;
		if (flags & (EGRESS_FIN_OUT | EGRESS_FIN_IN))
			return EGRESS_TCP_HALF_CLOSED_NS;
		return (flags & EGRESS_REPLIED) ? EGRESS_TCP_ESTABLISHED_NS : EGRESS_TCP_OPENING_NS;
	}
	if (proto == IPPROTO_UDP_)
		return (flags & EGRESS_REPLIED) ? EGRESS_UDP_REPLIED_NS : EGRESS_UDP_NS;
	return EGRESS_ICMP_NS;
}

/* TCP 0, UDP 1, ICMP echo 2: the row of egress_state. */
static __always_inline __u32 egress_index(__u8 proto, __u32 uplink, __u16 port)
{
	__u32 row = proto == IPPROTO_TCP_ ? 0 : proto == IPPROTO_UDP_ ? 1
								      : 2;
	return row * EGRESS_PORTS + (uplink % EGRESS_UPLINKS) * 65536 + port;
}

/* A flow's packet seen: its flags and its deadline move on. Plain stores:
 * only a claim, under the lock, takes a port that has expired. */
static __always_inline void egress_touch(struct egress_map *m, __u8 proto, __u32 set, __u64 now)
{
	__u32 f = (set & EGRESS_NEW) ? 0 : m->flags;
	if ((set & EGRESS_FIN_IN) && !(f & EGRESS_FIN_OUT))
		set |= EGRESS_REMOTE_FIRST;
	f |= set & ~EGRESS_NEW;
	if (f != m->flags)
		m->flags = f;
	if ((set & EGRESS_NEW) && m->fin_end)
		m->fin_end = 0;
	m->expires_ns = now + egress_timeout(proto, f);
}

static __always_inline int egress_same_flow(const struct egress_map *m, const struct egress_flow_key *k)
{
	return m->vm_addr == k->vm_addr && m->remote == k->remote && m->vm_port == k->vm_port &&
	       m->remote_port == k->remote_port;
}

/* Takes port (of vm's slice) for flow k if it is free (expired) or already
 * k's: 1 when taken. The lock makes two CPUs' claims of one port one. */
static __always_inline int egress_take(struct egress_map *m, const struct egress_flow_key *k, __u64 now, __u64 *was)
{
	int taken = 0;
	bpf_spin_lock(&m->lock);
	if (m->expires_ns <= now || egress_same_flow(m, k)) {
		*was = m->expires_ns;
		m->expires_ns = now + egress_timeout(k->proto, 0);
		m->vm_addr = k->vm_addr;
		m->remote = k->remote;
		m->vm_port = k->vm_port;
		m->remote_port = k->remote_port;
		m->flags = 0;
		m->fin_end = 0;
		taken = 1;
	}
	bpf_spin_unlock(&m->lock);
	return taken;
}

/* Records fk, a first fragment of slot's VM (either way), in the VM's own
 * place for its IP id: the VM's record there before goes, so a VM holds at
 * most EGRESS_FRAGS_PER_VM records and the table, sized for every VM's,
 * never has to evict another VM's to take one. */
static __always_inline void egress_frag_note(const struct egress_frag_key *fk, __u32 slot, __u64 now)
{
	if (trace_mode)
		return;
	__u32 at = (slot % EGRESS_MAX_VMS) * EGRESS_FRAGS_PER_VM + bpf_ntohs(fk->id) % EGRESS_FRAGS_PER_VM;
	struct egress_frag_key *place = bpf_map_lookup_elem(&egress_frag_places, &at);
	if (!place)
		return;
	struct egress_frag_key had = *place;
	if (had.remote != fk->remote || had.addr != fk->addr || had.id != fk->id || had.proto != fk->proto ||
	    had.dir != fk->dir) {
		struct egress_frag *old = bpf_map_lookup_elem(&egress_frags, &had);
		if (old && old->slot == slot)
			bpf_map_delete_elem(&egress_frags, &had);
		*place = *fk;
	}
	struct egress_frag f = {.when_ns = now, .slot = slot};
	bpf_map_update_elem(&egress_frags, fk, &f, BPF_ANY);
}

/* The VM's FIN on port (of its slice, host order): remembers the sequence
 * number just past it, which the remote's last ACK acknowledges. */
static __always_inline void egress_note_fin(struct iphdr *ip, struct packet *pkt, __u32 uplink, __u16 port)
{
	__u32 ihl = (ip->ihl & 0xf) * 4;
	struct tcphdr_min {
		__be16 sport, dport;
		__be32 seq, ack;
		__u8 doff, flags;
	} *th = (void *)ip + ihl;
	if ((void *)(th + 1) > pkt->data_end)
		return;
	__u32 idx = egress_index(IPPROTO_TCP_, uplink, port);
	struct egress_map *m = bpf_map_lookup_elem(&egress_state, &idx);
	if (m)
		m->fin_end = bpf_ntohl(th->seq) + bpf_ntohs(ip->tot_len) - ihl - (th->doff >> 4) * 4 + 1;
}

/* The port of vm's slice flow k leaves by (host order), found or claimed:
 * 0 when the slice has no free port among those tried. */
static __always_inline __u16 egress_port_for(const struct egress_flow_key *k, const struct egress_vm *vm, __u32 slot,
					     __u64 now, __u32 set, struct egress_counters *c)
{
	__u16 lo = vm->lo, hi = vm->hi;
	if (hi < lo || !lo)
		return 0;
	__u32 *have = bpf_map_lookup_elem(&egress_flows, k);
	if (have && *have >= lo && *have <= hi) {
		__u16 port = *have;
		__u32 idx = egress_index(k->proto, vm->uplink, port);
		struct egress_map *m = bpf_map_lookup_elem(&egress_state, &idx);
		if (m && egress_same_flow(m, k)) {
			if (m->expires_ns > now) {
				egress_touch(m, k->proto, set, now);
				return port;
			}
			__u64 was;
			if (egress_take(m, k, now, &was)) {
				egress_touch(m, k->proto, set, now);
				return port;
			}
		}
	}
	__u32 size = (__u32)hi - lo + 1;
	__u32 *cursor = bpf_map_lookup_elem(&egress_cursors, &slot);
	if (!cursor)
		return 0;
	__u32 start = *cursor % size;
	for (int i = 0; i < EGRESS_PROBES; i++) {
		if (i >= size)
			break;
		__u32 off = start + i;
		if (off >= size)
			off -= size;
		__u16 port = lo + off;
		__u32 idx = egress_index(k->proto, vm->uplink, port);
		struct egress_map *m = bpf_map_lookup_elem(&egress_state, &idx);
		if (!m)
			continue;
		__u64 was = 0;
		struct egress_flow_key old = {.vm_addr = m->vm_addr, .remote = m->remote, .vm_port = m->vm_port, .remote_port = m->remote_port, .proto = k->proto};
		if (!egress_take(m, k, now, &was))
			continue;
		/* The port's last flow, expired: its index entry goes, unless it
		 * has moved to another port since. */
		if (was) {
			__u32 *prev = bpf_map_lookup_elem(&egress_flows, &old);
			if (prev && *prev == port)
				bpf_map_delete_elem(&egress_flows, &old);
		}
		__u32 v = port;
		if (bpf_map_update_elem(&egress_flows, k, &v, BPF_ANY)) {
			m->expires_ns = 0;
			return 0;
		}
		egress_touch(m, k->proto, set, now);
		*cursor = off + 1; /* a race loses a turn, never a port: claims hold the lock */
		if (c)
			c->flows += 1;
		return port;
	}
	return 0;
}

/* Rewrites an address (at addr_off: the source's or destination's) and,
 * unless port_off is 0, the port or echo id there, patching the IPv4
 * checksum and the L4 one (csum_off; 0 for a later fragment, whose L4
 * checksum is in its first). TCP and UDP checksums cover the addresses
 * (their pseudo-header), ICMP's does not. */
static __always_inline void egress_rewrite(struct __sk_buff *skb, __u8 proto, __u32 addr_off, __be32 from, __be32 to,
					   __u32 csum_off, __u32 port_off, __be16 pfrom, __be16 pto)
{
	__u32 mangled = proto == IPPROTO_UDP_ ? BPF_F_MARK_MANGLED_0 : 0;
	if (csum_off && proto != IPPROTO_ICMP_)
		bpf_l4_csum_replace(skb, csum_off, from, to, BPF_F_PSEUDO_HDR | mangled | 4);
	if (csum_off && port_off && pfrom != pto) {
		bpf_l4_csum_replace(skb, csum_off, pfrom, pto, mangled | 2);
		bpf_skb_store_bytes(skb, port_off, &pto, 2, 0);
	}
	bpf_l3_csum_replace(skb, ETH_HLEN + 10, from, to, 4);
	bpf_skb_store_bytes(skb, addr_off, &to, 4, 0);
}

static __always_inline __u32 egress_csum_off(__u8 proto, __u32 l4_off)
{
	return l4_off + (proto == IPPROTO_TCP_ ? 16 : proto == IPPROTO_UDP_ ? 6
									    : 2);
}

/* Out the uplink, to the next hop the host's own routes and neighbours
 * give (the fabric's router, or the destination on the fabric itself). */
static __always_inline int egress_send(struct __sk_buff *skb, const struct egress_vm *vm, struct egress_counters *c)
{
	if (c) {
		c->packets_out += 1;
		c->bytes_out += skb->len;
	}
	count_forward(FWD_EGRESS_OUT);
	return redirect_neigh(vm->uplink_ifindex);
}

/* A VM's packet out whose TTL its gateway hop ends: answered as a router
 * would, with time exceeded from its gateway (traceroute's first hop), as
 * vif.c answers a routed one; dropped as ttl_exceeded if it cannot be. */
static __always_inline int egress_ttl_exceeded(struct __sk_buff *skb, const struct vif_info *vif)
{
	if (make_time_exceeded(skb, vif->mac) == 0) {
		count_forward(FWD_GATEWAY_REPLY);
		return reply_to_vif(skb, skb->ifindex, vif->kind);
	}
	struct packet rebuilt = {}; /* the frame may be half rebuilt: log no headers */
	return drop_packet(skb, &rebuilt, DROP_TTL_EXCEEDED);
}

#include "publish.h"
/* Floating addresses: their hooks in egress_out and egress_in. */
#include "floating.h"

/* A VM's packet to an address outside the tenant space. */
static __always_inline int egress_out(struct __sk_buff *skb, struct packet *pkt, const struct vif_info *vif,
				      __u32 epoch)
{
	struct iphdr *ip = pkt->ip;
	__be32 vm_addr = vif->ip;
	int published = TC_ACT_SHOT;
	if (publish_out(skb, pkt, vm_addr, &published) == EGRESS_TAKEN)
		return published; /* an answer from a published port */
	__u32 *slotp = bpf_map_lookup_elem(&egress_vms, &vm_addr);
	if (!slotp)
		return drop_packet(skb, pkt, DROP_NO_ROUTE);
	__u32 slot = *slotp;
	struct egress_vm *vm = bpf_map_lookup_elem(&egress_slots, &slot);
	if (!vm || vm->vm_addr != vm_addr || !vm->host_addr)
		return drop_packet(skb, pkt, DROP_NO_ROUTE);
	struct egress_counters *c = egress_counters_of(slot);
	__be32 remote = ip->daddr;
	/* The host's own services are not reached through the translation. */
	if (bpf_map_lookup_elem(&egress_addrs, &remote))
		return drop_packet(skb, pkt, DROP_EGRESS_TO_HOST);
	struct egress_to_key tk = {.prefixlen = 64, .slot = bpf_htonl(slot), .addr = remote};
	if (!vm->to_any && !bpf_map_lookup_elem(&egress_to, &tk)) {
		if (c)
			c->not_allowed += 1;
		return drop_packet(skb, pkt, DROP_EGRESS_NOT_ALLOWED);
	}
	if (vm->floating)
		return floating_out(skb, pkt, vif, vm, c, epoch);
	__u8 proto = ip->protocol;
	__u64 now = packet_now(pkt);
	__be16 id = ip->id;
	__u32 l4_off = ETH_HLEN + (ip->ihl & 0xf) * 4;
	if (proto != IPPROTO_TCP_ && proto != IPPROTO_UDP_ && proto != IPPROTO_ICMP_)
		return drop_packet(skb, pkt, DROP_EGRESS_PROTO);

	if (ip->frag_off & bpf_htons(IP_OFFSET_MASK)) {
		/* A later fragment: no ports; it follows its first fragment. */
		struct egress_frag_key fk = {.remote = remote, .addr = vm_addr, .id = id, .proto = proto, .dir = EGRESS_FRAG_OUT};
		struct egress_frag *f = bpf_map_lookup_elem(&egress_frags, &fk);
		if (!f || f->slot != slot || now - f->when_ns >= FRAG_LIFETIME_NS)
			return drop_packet(skb, pkt, DROP_FRAG_NO_FIRST);
		if (take_gateway_hop(ip))
			return egress_ttl_exceeded(skb, vif);
		egress_rewrite(skb, proto, ETH_HLEN + 12, vm_addr, vm->host_addr, 0, 0, 0, 0);
		return egress_send(skb, vm, c);
	}
	struct l4_ports p = l4_of(pkt);
	if (!p.known)
		return drop_packet(skb, pkt, DROP_MALFORMED);
	__u32 port_off = l4_off;
	struct egress_flow_key k = {.vm_addr = vm_addr, .remote = remote, .vm_port = p.sport, .remote_port = p.dport, .proto = proto};
	__u32 set = 0;
	if (proto == IPPROTO_ICMP_) {
		/* Only echo requests open a flow; a VM's errors would quote a
		 * packet from outside, which never reaches it untranslated. */
		if (p.icmp_type != ICMP_ECHO_REQUEST)
			return drop_packet(skb, pkt, DROP_EGRESS_PROTO);
		k.remote_port = 0;
		port_off = l4_off + 4;
	} else if (proto == IPPROTO_TCP_) {
		__u8 *fl = (void *)ip + (ip->ihl & 0xf) * 4 + 13;
		if ((void *)(fl + 1) > pkt->data_end)
			return drop_packet(skb, pkt, DROP_MALFORMED);
		if (*fl & TCP_FLAG_FIN)
			set |= EGRESS_FIN_OUT;
		if (*fl & TCP_FLAG_RST)
			set |= EGRESS_RST;
		if ((*fl & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN)
			set |= EGRESS_NEW; /* the tuple again, after its last connection closed */
	}
	if (vif->firewall) {
		__u16 fw_port = proto == IPPROTO_ICMP_ ? 0 : bpf_ntohs(p.dport);
		if (!firewall_allows(vm_addr, FW_SIDE(FW_OUT, policy_gen(epoch)), remote, proto, fw_port))
			return drop_packet(skb, pkt, DROP_FIREWALL_OUT);
	}
	if (take_gateway_hop(ip))
		return egress_ttl_exceeded(skb, vif);
	__u16 port = egress_port_for(&k, vm, slot, now, set, c);
	if (!port) {
		if (c)
			c->refused += 1;
		return drop_packet(skb, pkt, DROP_EGRESS_SLICE_FULL);
	}
	if (set & EGRESS_FIN_OUT)
		egress_note_fin(ip, pkt, vm->uplink, port);
	if (ip->frag_off & bpf_htons(IP_MF)) {
		struct egress_frag_key fk = {.remote = remote, .addr = vm_addr, .id = id, .proto = proto, .dir = EGRESS_FRAG_OUT};
		egress_frag_note(&fk, slot, now);
	}
	egress_rewrite(skb, proto, ETH_HLEN + 12, vm_addr, vm->host_addr, egress_csum_off(proto, l4_off), port_off,
		       k.vm_port, bpf_htons(port));
	return egress_send(skb, vm, c);
}

/* Into the VM at vm_addr, as from its gateway. */
static __always_inline int egress_deliver(struct __sk_buff *skb, __be32 vm_addr, __u32 slot)
{
	struct endpoint *dst = bpf_map_lookup_elem(&endpoints, &vm_addr);
	if (!dst)
		return drop_quietly(DROP_FABRIC_NOT_LOCAL);
	struct egress_counters *c = trace_mode ? 0 : egress_counters_of(slot);
	if (c) {
		c->packets_in += 1;
		c->bytes_in += skb->len;
	}
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > data_end)
		return drop_quietly(DROP_MALFORMED);
	mac_copy(eth->h_dest, dst->mac);
	virtual_mac(gateway_of(vm_addr), eth->h_source);
	count_forward(FWD_EGRESS_IN);
	return deliver_to_vif(skb, dst->ifindex, dst->kind, 0);
}

/* The live translation of port on uplink for remote (and remote_port, but
 * for ICMP echo), or 0: a packet to a slice's port enters only by one. */
static __always_inline struct egress_map *egress_live(__u8 proto, __u32 uplink, __u16 port, __be32 remote,
						      __be16 remote_port, __u64 now, __u32 *slot)
{
	__u32 pk = (uplink % EGRESS_UPLINKS) * 65536 + port;
	struct egress_owner *o = bpf_map_lookup_elem(&egress_ports, &pk);
	if (!o || o->kind != EGRESS_OWNER_SLICE)
		return 0;
	__u32 idx = egress_index(proto, uplink, port);
	struct egress_map *m = bpf_map_lookup_elem(&egress_state, &idx);
	if (!m || m->expires_ns <= now || m->remote != remote)
		return 0;
	if (proto != IPPROTO_ICMP_ && m->remote_port != remote_port)
		return 0;
	/* Its VM must still own the slice (a slice handed on keeps nothing). */
	struct egress_vm *vm = bpf_map_lookup_elem(&egress_slots, &o->slot);
	if (!vm || vm->vm_addr != m->vm_addr)
		return 0;
	*slot = o->slot;
	return m;
}

/* An ICMP error to a host address about a flow of a slice (its quote: from
 * the host's address and a slice port to remote): to the VM, quoting the
 * VM's own address and port (and a quoted UDP checksum to match). */
static __always_inline int egress_error_in(struct __sk_buff *skb, struct packet *pkt, const struct egress_addr *a,
					   __u32 l4_off, __u64 now, int *verdict)
{
	struct icmp_quote q;
	__u8 *icmp = (void *)pkt->data + l4_off;
	if ((void *)(icmp + 8) > pkt->data_end)
		return EGRESS_PASS;
	if (!icmp_quote_of(icmp, l4_off, pkt->data_end, &q))
		return EGRESS_PASS;
	struct iphdr *in = q.ip;
	if (in->saddr != pkt->ip->daddr)
		return EGRESS_PASS;
	__u8 proto = in->protocol;
	__be16 port, remote_port;
	__u32 port_off = q.l4_off;
	if (proto == IPPROTO_TCP_ || proto == IPPROTO_UDP_) {
		port = *(__be16 *)q.l4;
		remote_port = *(__be16 *)(q.l4 + 2);
	} else if (proto == IPPROTO_ICMP_ && q.l4[0] == ICMP_ECHO_REQUEST) {
		port = *(__be16 *)(q.l4 + 4);
		remote_port = 0;
		port_off += 4;
	} else {
		return EGRESS_PASS;
	}
	__u32 slot = 0;
	struct egress_map *m = egress_live(proto, a->uplink, bpf_ntohs(port), in->daddr, remote_port, now, &slot);
	if (!m)
		return EGRESS_PASS;
	__be32 host = in->saddr, vm_addr = m->vm_addr;
	__be16 vm_port = m->vm_port;
	__u32 inner_off = l4_off + 8;
	__u32 icmp_csum = l4_off + 2;
	__be16 old_check = in->check;
	/* A quoted UDP header holds its checksum (TCP's lies past the 8
	 * bytes quoted): put back as the VM sent it, 0 (none) kept. */
	__u32 ucsum_off = q.l4_off + 6;
	__be16 old_ucsum = proto == IPPROTO_UDP_ ? *(__be16 *)(q.l4 + 6) : 0;
	/* A quoted echo request's checksum covers its id: put back as the
	 * VM's was, with its id. */
	__u32 qcsum_off = q.l4_off + 2;
	__be16 old_qcsum = proto == IPPROTO_ICMP_ ? *(__be16 *)(q.l4 + 2) : 0;
	if (take_gateway_hop(pkt->ip)) {
		*verdict = drop_packet(skb, pkt, DROP_TTL_EXCEEDED);
		return EGRESS_TAKEN;
	}
	if (old_ucsum) {
		__be16 u = csum_replace16(csum_replace16(old_ucsum, host & 0xffff, vm_addr & 0xffff), host >> 16, vm_addr >> 16);
		u = csum_replace16(u, port, vm_port);
		if (!u)
			u = 0xffff;
		bpf_l4_csum_replace(skb, icmp_csum, old_ucsum, u, 2);
		bpf_skb_store_bytes(skb, ucsum_off, &u, 2, 0);
	}
	/* The quoted header: its source and its checksum, and the ICMP
	 * checksum over both. */
	__be16 new_check = csum_replace16(csum_replace16(old_check, host & 0xffff, vm_addr & 0xffff), host >> 16,
					  vm_addr >> 16);
	bpf_l4_csum_replace(skb, icmp_csum, host, vm_addr, 4);
	bpf_l4_csum_replace(skb, icmp_csum, old_check, new_check, 2);
	bpf_skb_store_bytes(skb, inner_off + 12, &vm_addr, 4, 0);
	bpf_skb_store_bytes(skb, inner_off + 10, &new_check, 2, 0);
	if (port != vm_port) {
		bpf_l4_csum_replace(skb, icmp_csum, port, vm_port, 2);
		bpf_skb_store_bytes(skb, port_off, &vm_port, 2, 0);
		if (proto == IPPROTO_ICMP_) {
			__be16 qc = csum_replace16(old_qcsum, port, vm_port);
			bpf_l4_csum_replace(skb, icmp_csum, old_qcsum, qc, 2);
			bpf_skb_store_bytes(skb, qcsum_off, &qc, 2, 0);
		}
	}
	bpf_l3_csum_replace(skb, ETH_HLEN + 10, host, vm_addr, 4);
	bpf_skb_store_bytes(skb, ETH_HLEN + 16, &vm_addr, 4, 0);
	*verdict = egress_deliver(skb, vm_addr, slot);
	return EGRESS_TAKEN;
}

/* A packet from the fabric: EGRESS_PASS unless it is for a host address and
 * a live translation of a slice (or a later fragment of a datagram whose
 * first fragment was one). Everything else goes on as before: to the
 * host's stack, or port space's slivers. */
static __always_inline int egress_in(struct __sk_buff *skb, struct packet *pkt, int *verdict)
{
	struct iphdr *ip = pkt->ip;
	__be32 host = ip->daddr;
	struct egress_addr *a = bpf_map_lookup_elem(&egress_addrs, &host);
	if (a && a->kind == EGRESS_ADDR_FLOATING)
		return EGRESS_FLOATING; /* uplink.c's floating program takes it */
	if (!a || a->kind != EGRESS_ADDR_UPLINK)
		return EGRESS_PASS;
	__u8 proto = ip->protocol;
	__be32 remote = ip->saddr;
	__be16 id = ip->id;
	__u64 now = packet_now(pkt);
	__u32 l4_off = ETH_HLEN + (ip->ihl & 0xf) * 4;
	if (ip->frag_off & bpf_htons(IP_OFFSET_MASK)) {
		struct egress_frag_key fk = {.remote = remote, .addr = host, .id = id, .proto = proto, .dir = EGRESS_FRAG_IN};
		struct egress_frag *f = bpf_map_lookup_elem(&egress_frags, &fk);
		if (!f || now - f->when_ns >= FRAG_LIFETIME_NS)
			return EGRESS_PASS;
		__u32 slot = f->slot;
		struct egress_vm *vm = bpf_map_lookup_elem(&egress_slots, &slot);
		if (!vm || !vm->vm_addr)
			return EGRESS_PASS;
		__be32 vm_addr = vm->vm_addr;
		if (take_gateway_hop(ip)) {
			*verdict = drop_packet(skb, pkt, DROP_TTL_EXCEEDED);
			return EGRESS_TAKEN;
		}
		egress_rewrite(skb, proto, ETH_HLEN + 16, host, vm_addr, 0, 0, 0, 0);
		*verdict = egress_deliver(skb, vm_addr, slot);
		return EGRESS_TAKEN;
	}
	struct l4_ports p = l4_of(pkt);
	if (!p.known)
		return EGRESS_PASS;
	__u16 port;
	__be16 remote_port = p.sport;
	__u32 port_off = l4_off + 2;
	__u32 set = EGRESS_REPLIED;
	__u64 ack = ~0ULL; /* a TCP ACK's number, if the packet has one */
	if (proto == IPPROTO_ICMP_) {
		if (is_icmp_error(p.icmp_type))
			return egress_error_in(skb, pkt, a, l4_off, now, verdict);
		if (p.icmp_type != ICMP_ECHO_REPLY)
			return EGRESS_PASS;
		port = bpf_ntohs(p.dport);
		remote_port = 0;
		port_off = l4_off + 4;
	} else if (proto == IPPROTO_TCP_ || proto == IPPROTO_UDP_) {
		port = bpf_ntohs(p.dport);
		if (proto == IPPROTO_TCP_) {
			__u8 *fl = (void *)ip + (ip->ihl & 0xf) * 4 + 13;
			if ((void *)(fl + 1) > pkt->data_end)
				return EGRESS_PASS;
			if (*fl & TCP_FLAG_FIN)
				set |= EGRESS_FIN_IN;
			if (*fl & TCP_FLAG_RST)
				set |= EGRESS_RST;
			__be32 *ackp = (void *)(fl - 5);
			if ((*fl & TCP_FLAG_ACK) && (void *)(ackp + 1) <= pkt->data_end)
				ack = bpf_ntohl(*ackp);
		}
	} else {
		return EGRESS_PASS;
	}
	if (proto != IPPROTO_ICMP_ && publish_in(skb, pkt, a->uplink, port, l4_off, verdict) == EGRESS_TAKEN)
		return EGRESS_TAKEN;
	__u32 slot = 0;
	struct egress_map *m = egress_live(proto, a->uplink, port, remote, remote_port, now, &slot);
	/* No live translation for this sender, on a port of a slice or not:
	 * the host's own, as before egress. A slice may cover a port a host
	 * service listens on (etcd, a metrics port); only this sender's
	 * packets to this port go to the VM while its flow lives. */
	if (!m)
		return EGRESS_PASS;
	/* 0: the VM's FIN is not noted yet (another CPU is between the claim
	 * and egress_note_fin), so nothing is done before it is. */
	if (ack != ~0ULL && m->fin_end && (m->flags & (EGRESS_FIN_OUT | EGRESS_REMOTE_FIRST)) == (EGRESS_FIN_OUT | EGRESS_REMOTE_FIRST) &&
	    (__s32)((__u32)ack - m->fin_end) >= 0)
		set |= EGRESS_DONE;
	if (!trace_mode)
		egress_touch(m, proto, set, now);
	__be32 vm_addr = m->vm_addr;
	__be16 vm_port = m->vm_port;
	if ((ip->frag_off & bpf_htons(IP_MF)) && !trace_mode) {
		struct egress_frag_key fk = {.remote = remote, .addr = host, .id = id, .proto = proto, .dir = EGRESS_FRAG_IN};
		egress_frag_note(&fk, slot, now);
	}
	if (take_gateway_hop(ip)) {
		*verdict = drop_packet(skb, pkt, DROP_TTL_EXCEEDED);
		return EGRESS_TAKEN;
	}
	egress_rewrite(skb, proto, ETH_HLEN + 16, host, vm_addr, egress_csum_off(proto, l4_off), port_off,
		       bpf_htons(port), vm_port);
	*verdict = egress_deliver(skb, vm_addr, slot);
	return EGRESS_TAKEN;
}

#endif
