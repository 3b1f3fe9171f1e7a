/* Every way a program hands a frame to another device, in one place.
 * BPF_PROG_RUN returns TC_ACT_REDIRECT whatever the target, so a test
 * cannot see where a frame would have gone. Built with
 * -DONEHOP_TEST_HOOKS (the vifTest/uplinkTest objects, loaded only by
 * tests), each redirect and clone is also written to `redirect_log`; the
 * production objects compile these helpers down to the bare helper call. */
#ifndef ONEHOP_REDIRECT_H
#define ONEHOP_REDIRECT_H

#include "common.h"
#include "endpoint_maps.h"
#include "trace.h"

/* How a frame left: out of a device (bpf_redirect to its egress), into a
 * veth peer's namespace (bpf_redirect_peer), or as a copy (bpf_clone_redirect
 * to its egress). */
enum redirect_kind {
	REDIRECT_NONE = 0,
	REDIRECT_OUT,
	REDIRECT_PEER,
	REDIRECT_CLONE,
	REDIRECT_IN,       /* bpf_redirect to a device's ingress, as if it had arrived there */
	REDIRECT_CLONE_IN, /* bpf_clone_redirect to a device's ingress: a copy into a macvtap guest */
	REDIRECT_NEIGH,    /* bpf_redirect_neigh out of a device: the host's routes and neighbours pick the MACs */
};

/* In BTF for bpf2go -type: a trace names the kind of its target. */
const enum redirect_kind *_redirect_kind_type __attribute__((unused));

#ifdef ONEHOP_TEST_HOOKS
#define REDIRECT_LOG_MAX 8
/* What one program run redirected and cloned, in order; count goes on past
 * REDIRECT_LOG_MAX so a test sees that entries were lost. The test zeroes
 * it before each run. */
struct redirect_trace {
	__u32 count;
	__u32 ifindex[REDIRECT_LOG_MAX];
	__u32 kind[REDIRECT_LOG_MAX];
};

/* Not pinned: each test object has its own. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct redirect_trace);
} redirect_log SEC(".maps");

const struct redirect_trace *_redirect_trace_type __attribute__((unused));

static __always_inline void log_redirect(__u32 ifindex, __u32 kind)
{
	__u32 zero = 0;
	struct redirect_trace *l = bpf_map_lookup_elem(&redirect_log, &zero);
	if (!l)
		return;
	__u32 i = l->count;
	if (i < REDIRECT_LOG_MAX) {
		l->ifindex[i & (REDIRECT_LOG_MAX - 1)] = ifindex;
		l->kind[i & (REDIRECT_LOG_MAX - 1)] = kind;
	}
	l->count = i + 1;
}
#else
#define log_redirect(ifindex, kind) ((void)0)
#endif

/* Out of the device with this ifindex (its egress). */
static __always_inline int redirect_out(__u32 ifindex)
{
	log_redirect(ifindex, REDIRECT_OUT);
	if (trace_mode)
		trace_target(ifindex, REDIRECT_OUT);
	return bpf_redirect(ifindex, 0);
}

/* Out of the device with this ifindex, to the next hop the host's own FIB
 * and neighbour table give (egress.h: destinations outside tenant space). */
static __always_inline int redirect_neigh(__u32 ifindex)
{
	log_redirect(ifindex, REDIRECT_NEIGH);
	return bpf_redirect_neigh(ifindex, 0, 0, 0);
}

/* Straight into the namespace of the veth peer of ifindex, as if it had
 * arrived there: skips a backlog pass. */
static __always_inline int redirect_peer(__u32 ifindex)
{
	log_redirect(ifindex, REDIRECT_PEER);
	if (trace_mode)
		trace_target(ifindex, REDIRECT_PEER);
	return bpf_redirect_peer(ifindex, 0);
}

/* Into the device with this ifindex, as if it had arrived there: the
 * kernel takes the frame through eth_type_trans again (its packet type is
 * judged anew from its destination MAC). */
static __always_inline int redirect_in(__u32 ifindex)
{
	log_redirect(ifindex, REDIRECT_IN);
	if (trace_mode)
		trace_target(ifindex, REDIRECT_IN);
	return bpf_redirect(ifindex, BPF_F_INGRESS);
}

/* A copy out of the device with this ifindex; the frame itself stays with
 * the caller. Returns 0 when the copy was sent. */
static __always_inline long clone_out(struct __sk_buff *skb, __u32 ifindex)
{
	log_redirect(ifindex, REDIRECT_CLONE);
	return bpf_clone_redirect(skb, ifindex, 0);
}

/* Into a macvtap guest: the macvtap's ingress hands the frame to its fd
 * (tap_handle_frame), past the guard that passes only this mark. Its egress
 * would send the frame out of the lower device instead. */
static __always_inline int deliver_in_guest(struct __sk_buff *skb, __u32 ifindex)
{
	skb->mark = GUEST_MARK;
	return redirect_in(ifindex);
}

/* To the guest behind the vif with this ifindex, the way its kind (enum
 * vif_kind) takes a frame: into a veth's peer, out of a tap (to the
 * process reading it: QEMU), into a macvtap. from_egress: the caller is a
 * macvtap's program, on its egress, where bpf_redirect_peer drops (it works
 * from ingress only): a veth is reached out of its host end instead. */
static __always_inline int deliver_to_vif(struct __sk_buff *skb, __u32 ifindex, __u8 kind, int from_egress)
{
	if (kind == VIF_MACVTAP)
		return deliver_in_guest(skb, ifindex);
	if (kind == VIF_TAP || from_egress)
		return redirect_out(ifindex);
	return redirect_peer(ifindex);
}

/* A reply to the guest that sent the frame, on the vif it came in by
 * (proxy ARP answers, the gateway's ping replies, time-exceeded): out of a
 * veth or tap, which reaches the guest; into a macvtap, whose egress the
 * frame came in by. */
static __always_inline int reply_to_vif(struct __sk_buff *skb, __u32 ifindex, __u8 kind)
{
	if (kind == VIF_MACVTAP)
		return deliver_in_guest(skb, ifindex);
	return redirect_out(ifindex);
}

/* A copy to the device *ifindex names (a VM's vif, or the uplink towards a
 * monitor's host): out of it, or, for a macvtap guest's vif (its vifs entry
 * says), into it with the guard's mark. ifindex points into a map value, so
 * the key costs no stack (the vif program's is at its limit). The frame
 * itself stays with the caller, its mark as it was. Returns 0 when the copy
 * was sent. */
static __always_inline long clone_to(struct __sk_buff *skb, const __u32 *ifindex)
{
	__u32 to = *ifindex;
	struct vif_info *vif = bpf_map_lookup_elem(&vifs, ifindex);
	if (!vif || vif->kind != VIF_MACVTAP)
		return clone_out(skb, to);
	__u32 mark = skb->mark;
	skb->mark = GUEST_MARK;
	log_redirect(to, REDIRECT_CLONE_IN);
	long err = bpf_clone_redirect(skb, to, BPF_F_INGRESS);
	skb->mark = mark;
	return err;
}

#endif
