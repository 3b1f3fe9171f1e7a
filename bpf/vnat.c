/* VNAT on an endpoint (paper §3–5): not a host program. It runs on the
 * interface of any Linux machine whose connections should survive a change
 * of address (in the lab: inside a VM's namespace, on its eth0), loaded by
 * internal/vnat. Two tcx programs translate migrated connections; a sockops
 * program records established TCP connections so the daemon knows what it
 * could migrate (paper §5.1's accept/connect/close interception). */
#include "lib/common.h"
#include "lib/vnat_maps.h"
#include "lib/vnat.h"
#include "lib/vnat_helper.h"

/* Keep the enums in BTF for bpf2go -type (Go reads counter names from them). */
const enum vnat_counter *_vnat_counter_type __attribute__((unused));
const enum vnat_dir *_vnat_dir_type __attribute__((unused));

/* tcx "next": the rest of the chain and the stack carry on. */
#define VNAT_TCX_NEXT -1

/* While nothing is migrated and no peer is away, both programs return
 * after one array lookup (paper §3.2: a connection that never moved costs
 * nothing). */
SEC("tc")
int vnat_egress(struct __sk_buff *skb)
{
	__u32 zero = 0;
	struct vnat_config *cfg = bpf_map_lookup_elem(&vnat_state, &zero);

	if (!cfg)
		return VNAT_TCX_NEXT;
	/* The helper looks at the virtual tuple the socket wrote, so it
	 * runs before the translation. */
	if (cfg->helpers) {
		int verdict = vnat_keepalive(skb);

		if (verdict)
			return verdict;
	}
	if (cfg->migrated)
		vnat_translate(skb, VNAT_EGRESS);
	return VNAT_TCX_NEXT;
}

SEC("tc")
int vnat_ingress(struct __sk_buff *skb)
{
	__u32 zero = 0;
	struct vnat_config *cfg = bpf_map_lookup_elem(&vnat_state, &zero);

	if (!cfg)
		return VNAT_TCX_NEXT;
	if (cfg->migrated)
		vnat_translate(skb, VNAT_INGRESS);
	if (cfg->helpers)
		vnat_helper_ingress(skb);
	return VNAT_TCX_NEXT;
}

/* TCP states (include/net/tcp_states.h; not in uapi). */
#define VNAT_TCP_ESTABLISHED 1
#define VNAT_TCP_CLOSE 7

static __always_inline void vnat_conn_key_of(struct bpf_sock_ops *skops,
					     struct vnat_conn_key *k)
{
	k->laddr = skops->local_ip4;
	k->raddr = skops->remote_ip4;
	/* local_port is host order; remote_port is network order in the
	 * upper half of the word on little-endian (sock_ops_convert_ctx_access
	 * shifts skc_dport left by 16). */
	k->lport = bpf_htons((__u16)skops->local_port);
	k->rport = (__be16)(skops->remote_port >> 16);
	k->proto = IPPROTO_TCP;
}

SEC("sockops")
int vnat_sockops(struct bpf_sock_ops *skops)
{
	struct vnat_conn_key k = {};

	if (skops->family != 2 /* AF_INET */)
		return 1;

	switch (skops->op) {
	case BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB:
	case BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB: {
		struct vnat_conn c = {
			.cookie = bpf_get_socket_cookie(skops),
			.established_ns = bpf_ktime_get_ns(),
			.state = VNAT_TCP_ESTABLISHED,
		};

		vnat_conn_key_of(skops, &k);
		bpf_map_update_elem(&vnat_conns, &k, &c, BPF_ANY);
		/* Ask for state changes so a closed connection is forgotten. */
		bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags |
							 BPF_SOCK_OPS_STATE_CB_FLAG);
		vnat_count(VNAT_CONNS_RECORDED);
		break;
	}
	case BPF_SOCK_OPS_STATE_CB: {
		struct vnat_conn *c;

		vnat_conn_key_of(skops, &k);
		if (skops->args[1] == VNAT_TCP_CLOSE) {
			if (bpf_map_delete_elem(&vnat_conns, &k) == 0)
				vnat_count(VNAT_CONNS_CLOSED);
			break;
		}
		c = bpf_map_lookup_elem(&vnat_conns, &k);
		if (c)
			c->state = skops->args[1];
		break;
	}
	}
	return 1;
}

char __license[] SEC("license") = "GPL";
