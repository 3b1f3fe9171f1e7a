/* The LISP data plane (RFC 9300) of the access gateway and of the data
 * center's tunnel router: not a host program. Loaded by internal/lispdp on
 * the node that tunnels (in the lab, inside the gw and xtr namespaces):
 *
 *   lisp_encap     tcx egress of an RLOC (WAN) interface: the node's own
 *                  packets to EIDs (the gateway's MPTCP subflows)
 *   lisp_encap_in  tcx ingress of an EID-facing interface (an xTR's site)
 *   lisp_decap     tcx ingress of an RLOC interface
 *   lisp_probe     run once by the loader: can this kernel decapsulate a
 *                  UDP-tunnel GSO superpacket in place?
 *
 * docs/lisp-datapath.md has the packet format, the maps and the limits. */
#include "lib/common.h"
#include "lib/lisp_maps.h"
#include "lib/lisp.h"

/* Keep the enums in BTF for bpf2go -type (Go reads counter names from them). */
const enum lisp_counter *_lisp_counter_type __attribute__((unused));
const enum lisp_path_flag *_lisp_path_flag_type __attribute__((unused));
const enum lisp_eid_flag *_lisp_eid_flag_type __attribute__((unused));

SEC("tc")
int lisp_encap(struct __sk_buff *skb)
{
	return lisp_encapsulate(skb, 0);
}

SEC("tc")
int lisp_encap_in(struct __sk_buff *skb)
{
	return lisp_encapsulate(skb, 1);
}

SEC("tc")
int lisp_decap(struct __sk_buff *skb)
{
	return lisp_decapsulate(skb);
}

/* Returns bpf_skb_adjust_room's answer to BPF_F_ADJ_ROOM_DECAP_L4_UDP (a
 * flag of kernels after 6.18): 0 where known, -EINVAL where not. */
SEC("tc")
int lisp_probe(struct __sk_buff *skb)
{
	return bpf_skb_adjust_room(skb, -(int)sizeof(struct lisp_hdr), BPF_ADJ_ROOM_MAC,
				   LISP_ADJ_ROOM_DECAP_L4_UDP);
}

char __license[] SEC("license") = "GPL";
