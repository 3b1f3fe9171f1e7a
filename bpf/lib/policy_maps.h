/* Who may talk to whom: the visibility rules between subnets and each VM's
 * own firewall, written by the agent (reconciled).
 *
 * Every key carries a generation (0 or 1). The programs consult only the
 * generation in force, the low bit of node_config.policy_epoch, read once
 * per packet. The agent writes a changed rule set under the other
 * generation beside the one in force, switches with one write of the
 * epoch, waits until no program still runs under the old one, and only
 * then deletes it: no packet is ever judged by a half-written set, or by a
 * mix of the old and the new (docs/datapath.md, "Rule updates"). Each map
 * holds two generations, so its capacity per rule set is half its size. */
#ifndef ONEHOP_POLICY_MAPS_H
#define ONEHOP_POLICY_MAPS_H

#include "common.h"
#include "endpoint_maps.h"

/* Visibility rules per generation (the per-host figure: only the rules of
 * farms with VMs on the host reach it). */
#define MAX_VIS_RULES 16384

/* A visibility rule (paper §2, step 2): traffic from one subnet to another
 * that the farm owner (and, across farms, both owners) allowed. proto 0 and
 * port 0 are wildcards; port is the destination port, host order. */
struct vis_key {
	__u16 src_farm;
	__u16 src_subnet;
	__u16 dst_farm;
	__u16 dst_subnet;
	__u8 proto;
	__u8 gen;
	__u16 port;
};

/* A VM's own firewall (paper §2, per-VM policies): ordered rules per
 * direction, first match wins, else the direction's default. Enforced on the
 * VM's host, outside the VM, so a compromised VM cannot lift it. */
#define FW_MAX_RULES 16
#define FW_IN 0
#define FW_OUT 1

struct fw_policy_key {
	__be32 vm;
	__u8 gen;
	__u8 _pad[3];
};

struct fw_policy {
	__u8 count[2]; /* rules per direction (FW_IN, FW_OUT) */
	__u8 default_allow[2];
};

struct fw_key {
	__be32 vm;
	__u8 dir;
	__u8 index;
	__u8 gen;
	__u8 _pad;
};

struct fw_rule {
	__be32 net;    /* remote address ... */
	__be32 mask;   /* ... and prefix mask */
	__u16 port_lo; /* VM-side port for in, remote port for out; 0: any */
	__u16 port_hi;
	__u8 proto; /* 0: any */
	__u8 allow;
	__u16 _pad;
};

/* Written rarely, read per packet: allocated as used, not up front, since
 * two generations need twice the room only while they switch. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 2 * MAX_VIS_RULES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct vis_key);
	__type(value, __u8);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} visibility SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 2 * MAX_VIFS);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct fw_policy_key);
	__type(value, struct fw_policy);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} firewalls SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 2 * MAX_VIFS * FW_MAX_RULES * 2);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct fw_key);
	__type(value, struct fw_rule);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} firewall_rules SEC(".maps");

/* The rule generation in force: read once per packet and handed down, so
 * every rule one packet meets comes from the same set. */
static __always_inline __u8 policy_gen(__u32 epoch)
{
	return epoch & 1;
}

#endif
