/* Types and constants shared by every onehop datapath program and, through
 * bpf2go -type, by the Go agent. Change a struct here and `go generate ./...`
 * regenerates its Go twin; never write the Go side by hand. */
#ifndef ONEHOP_COMMON_H
#define ONEHOP_COMMON_H

#include <linux/types.h>
#include <linux/bpf.h>
#include <linux/pkt_cls.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define ETH_ALEN 6

/* Per-node facts the programs need; a single-slot array (node_maps.h). */
struct node_config {
	__u32 uplink_ifindex;
	__u8 uplink_mac[ETH_ALEN];
	__u16 _pad;
	__be32 vm_net;  /* the tenant address space (10.0.0.0/8) ... */
	__be32 vm_mask; /* ... so the uplink can tell VM traffic from management */
	/* Moves on by one whenever rules or firewalls change: a flow admitted
	 * under an older epoch is checked again against the rules in force.
	 * Its low bit is the policy generation in force (policy_maps.h): the
	 * agent writes a new rule set beside the old one, under the other
	 * generation, and this one word switches to it. */
	__u32 policy_epoch;
	/* Which features have state on this node (enum feature_bit): a
	 * feature's stage runs only when its bit is set, so a node that uses
	 * no feature pays one test of this word, already loaded, and no map
	 * lookup (docs/architecture.md). */
	__u32 features;
};

/* One bit per feature in node_config.features, assigned as features arrive
 * (port space, TAP, VNAT, LISP). The virtual router is the programs' core
 * and has none. */
enum feature_bit {
	FEATURE_NONE = 0,
	FEATURE_PORTSPACE = 1 << 0,     /* slivers share the host's address (portspace.h) */
	FEATURE_TAP = 1 << 1,           /* copies of tapped traffic to monitor VMs (tap.h) */
	FEATURE_VNAT_LOCATION = 1 << 2, /* VMs' VNAT daemons reach the location server through the host (vnat_service.h) */
	FEATURE_EGRESS = 1 << 3,        /* VMs reach outside the tenant space through slices of the host's address (egress.h) */
};

static __always_inline int feature_on(const struct node_config *cfg, __u32 bit)
{
	return cfg->features & bit;
}

/* Why a packet was dropped. Each reason is its own metric label; the Go side
 * names them from this enum, so a new reason needs no hand-written mapping. */
enum drop_reason {
	DROP_NONE = 0,
	DROP_MALFORMED,            /* truncated or inconsistent headers */
	DROP_UNSUPPORTED,          /* EtherType we do not carry: IPv6, ... (VLAN tags: DROP_VLAN_TAGGED) */
	DROP_UNKNOWN_VIF,          /* frame from a vif the agent has not configured */
	DROP_SPOOFED_MAC,          /* VM sent with a source MAC not its own */
	DROP_SPOOFED_IP,           /* VM sent with a source IPv4 not its own */
	DROP_NO_ROUTE,             /* destination is no VM in the mapping table */
	DROP_NO_UPLINK,            /* remote destination but uplink not configured */
	DROP_ARP_SPOOFED,          /* ARP sender MAC/IP not the VM's own */
	DROP_ARP_NOT_REQUEST,      /* VM sent an ARP reply or other op: never leaves */
	DROP_ARP_UNKNOWN_TARGET,   /* ARP for an address no VM holds */
	DROP_ARP_OTHER_SUBNET,     /* ARP for an address outside the asker's subnet */
	DROP_FABRIC_UNKNOWN_SRC,   /* from the fabric, source VM mapped to another host, or local here */
	DROP_FABRIC_NOT_LOCAL,     /* from the fabric, destination VM not on this host */
	DROP_NOT_VISIBLE,          /* between subnets or farms without a rule allowing it */
	DROP_TTL_EXCEEDED,         /* routed between subnets with TTL 1: cannot take the gateway hop */
	DROP_AGENT_BUSY,           /* for the agent (DHCP), but its ring buffer was full */
	DROP_FIREWALL_IN,          /* the receiving VM's firewall refused it */
	DROP_FIREWALL_OUT,         /* the sending VM's firewall refused it */
	DROP_NO_MEMBERS,           /* a farm/subnet broadcast for which this host has no VM */
	DROP_ROGUE_DHCP,           /* a VM acting as DHCP server: only the host answers DHCP */
	DROP_ARP_NOT_HERE,         /* fabric ARP for a VM this host does not hold: multicast reaches every host */
	DROP_FABRIC_ARP_CONFLICT,  /* a host claims, by ARP, a VM that lives on this host */
	DROP_UNRESOLVED,           /* for an address being resolved, beyond what the agent holds per second */
	DROP_VLAN_TAGGED,          /* a VM sent an 802.1Q/802.1ad tagged frame: no VM picks VLANs or priorities on the underlay */
	DROP_FABRIC_UNKNOWN_HOST,  /* from the fabric, into tenant space, from a MAC that is no known host's uplink */
	DROP_FABRIC_NOT_TENANT,    /* from the fabric, a source no VM can hold: outside the tenant space, or a subnet's .0, .1 or .255 */
	DROP_FABRIC_NOT_BROADCAST, /* to a scope's fabric multicast MAC, but not a broadcast or multicast of that scope */
	DROP_ARP_UNSOLICITED,      /* a fabric ARP reply to this host for an address it did not ask about */
	DROP_CLAIM_LIMITED,        /* a host claims a VM mapped elsewhere again within a second: the agent is already checking */
	DROP_FRAG_NO_FIRST,        /* a later fragment whose first fragment this host did not admit (or admitted too long ago) */
	DROP_OVER_SHARE,           /* the VM is over its share of a table or the slow path every tenant shares */
	/* Port space (portspace.h); DROP_PS_FIRST..DROP_PS_LAST are also counted per sliver. */
	DROP_PS_NO_SLIVER,       /* from a sliver link the agent has not configured */
	DROP_PS_FOREIGN_MAC,     /* a sliver sent with a source MAC not its uplink's */
	DROP_PS_FOREIGN_IP,      /* a sliver sent with a source IPv4 not its uplink's public address */
	DROP_PS_FOREIGN_PORT,    /* a sliver sent from a TCP/UDP port (or about one, in an ICMP error) it does not lease */
	DROP_PS_FOREIGN_ECHO_ID, /* a sliver's echo request whose id could not be given one of its lease */
	DROP_PS_ICMP_REFUSED,    /* a sliver sent ICMP other than echo requests and errors about its own ports */
	DROP_PS_ARP_FORGED,      /* a sliver's ARP was not a request from its uplink's MAC and address */
	DROP_PS_FRAG_UNKNOWN,    /* a sliver's later fragment whose first fragment it did not send (or long ago) */
	DROP_PS_NOT_IPV4,        /* a sliver sent neither IPv4 nor ARP (IPv6, VLAN tags, ...) */
	DROP_PS_PROTO,           /* a sliver sent an IP protocol other than TCP, UDP, ICMP */
	DROP_PS_NO_UPLINK,       /* the sliver's uplink is not configured */
	DROP_PS_OVER_SHARE,      /* the sliver is over its share of fragment or echo-id records */
	/* Virtual TAP (tap.h). */
	DROP_RESERVED_FLAG,    /* a VM sent IPv4 with the reserved flag set: the fabric's copy marker, which no VM may forge */
	DROP_TAP_COPY_UNKNOWN, /* a copy from the fabric that no rule with a monitor on this host wants (or flooded past us) */
	/* macvtap guests (vif.c, vif_macvtap_guard). */
	DROP_MACVTAP_BYPASS,   /* reached a macvtap guest by its lower device's macvlan path, not from the datapath */
	DROP_MACVTAP_NO_STACK, /* a macvtap guest's frame for the host's stack (VNAT location): a macvtap has no way in */
	/* Revocation (policy.h, admit). */
	DROP_REVOKED, /* a flow admitted before, cut because the rules changed (a rule, peering or firewall allow removed):
		       * counted once per flow cut on this host, at the packet that found it no longer allowed */
	/* North-south egress (egress.h). */
	DROP_EGRESS_NOT_ALLOWED, /* a VM's packet outside the tenant space to a destination its farm's egress list does not hold */
	DROP_EGRESS_SLICE_FULL,  /* a VM's new flow out found no free port in its own slice: refused, counted for the VM */
	DROP_EGRESS_NO_MAPPING,  /* no longer counted (such packets go to the host's stack); kept so later reasons keep their numbers */
	DROP_EGRESS_PROTO,       /* a VM sent outside the tenant space neither TCP, UDP nor an ICMP echo request */
	DROP_EGRESS_TO_HOST,     /* a VM's packet to its host's own address through the translation */
	/* Published ports (publish.h). */
	DROP_PUBLISH_OPEN, /* a VM opened a TCP connection out from its published port: a publication answers, never opens */
	DROP_REASON_MAX,
};

/* What happened to packets that were not dropped. */
enum forward_path {
	FWD_LOCAL = 0,          /* VM to VM on this host */
	FWD_TO_FABRIC,          /* VM to a VM on another host, out the uplink */
	FWD_FROM_FABRIC,        /* from another host into a local VM */
	FWD_ARP_REPLY,          /* ARP answered in the datapath */
	FWD_HOST_STACK,         /* management traffic handed to the host's own stack */
	FWD_GATEWAY_REPLY,      /* echo request to the virtual gateway, answered in the datapath */
	FWD_ROUTED,             /* crossed the virtual gateway to another subnet or farm (also counted by path) */
	FWD_TO_AGENT,           /* handed to the agent to answer (DHCP) */
	FWD_BROADCAST,          /* a broadcast/multicast copy delivered to a VM of its scope */
	FWD_ARP_TO_FABRIC,      /* a VM's ARP the mapping table could not answer, sent to its scope's multicast address */
	FWD_ARP_ANSWERED,       /* a fabric ARP for one of this host's VMs, answered in the datapath */
	FWD_ARP_LEARNED,        /* a fabric ARP reply or announcement taken into the mapping table */
	FWD_HELD,               /* a packet for an address not yet mapped, held by the agent while it resolves */
	FWD_TO_SLIVER,          /* port space: delivered to a sliver by its port or echo id (or an ARP reply's copy) */
	FWD_FROM_SLIVER,        /* port space: a sliver's frame, checked, out of its uplink */
	FWD_TAP_COPY_LOCAL,     /* TAP: a copy into a monitor on this host, at the sender's edge */
	FWD_TAP_COPY_REMOTE,    /* TAP: a marked copy to a monitor's host, out of the uplink */
	FWD_TAP_COPY_RECOVERED, /* TAP: a copy from the fabric, restored, into a monitor on this host */
	FWD_VNAT_LOCATION,      /* a VM's VNAT daemon to the location service, handed to the host's stack (vnat_service.h) */
	FWD_EGRESS_OUT,         /* a VM's packet translated to a slice (or published port) of the host's address, out of the uplink (egress.h) */
	FWD_EGRESS_IN,          /* a reply (or ICMP error) to a slice's port, or a packet to a published port, translated into its VM */
	FWD_PATH_MAX,
};

/* What a guest's vif is, found by the agent from netlink (internal/datapath,
 * vifkind.go) and kept in its endpoint and vif_info entries: how a frame
 * reaches the guest depends on it (deliver_to_vif, redirect.h). */
enum vif_kind {
	VIF_VETH = 0, /* the host end of a veth pair: delivered into its peer */
	VIF_TAP,      /* a tap (QEMU, libvirt): delivered out of the device, to its reader */
	VIF_MACVTAP,  /* a macvtap (libvirt type='direct'): the vif program sits on its egress,
		       * delivered into its ingress, marked (GUEST_MARK) */
};

/* The skb mark of a frame the datapath (or the agent, by its marked packet
 * socket) hands to a macvtap guest. A macvtap's lower device hands the
 * guest frames too, through the macvlan rx path (drivers/net/macvlan.c):
 * the guard on the macvtap's ingress lets through only frames with this
 * mark, so the guest receives only what the datapath delivers. A frame
 * from a guest or from the wire cannot carry it: tap and tun writes start
 * at mark 0, veths clear it between namespaces, and only CAP_NET_ADMIN sets
 * SO_MARK. An enum so the agent's twin is generated (bpf2go -type). */
enum guest_mark {
	GUEST_MARK = 0x6f680001, /* "oh", 1 */
};

/* A frame the agent must handle, copied whole (up to SLOWPATH_MAX bytes)
 * into the slowpath ring (slowpath_maps.h). */
#define SLOWPATH_MAX 1536
enum slowpath_kind {
	SLOW_DHCP = 0,      /* a VM's DHCP request: the agent answers it */
	SLOW_HOLD,          /* a routed, admitted frame whose destination host is unknown:
			 * the agent resolves it and sends the frame on */
	SLOW_ARP_REPLY,     /* a fabric ARP reply to the agent's own question */
	SLOW_MAPPING_CLAIM, /* a known host says it holds a VM this host maps elsewhere: the
			     * agent checks the store before the entry follows */
};

struct slowpath_event {
	__u32 kind;
	__u32 ifindex;
	__u32 len;      /* bytes in data */
	__u32 orig_len; /* the frame's length: more than len when it did not fit */
	__u8 data[SLOWPATH_MAX];
};

/* What an event in the drop_events ring tells (observe.h). */
enum observe_kind {
	OBSERVE_DROP = 0, /* a dropped packet: reason and addresses (drop.h) */
	OBSERVE_FLOW,     /* a new flow admitted and remembered (policy.h, admit), while someone observes */
};

/* Sent to the agent through a ring buffer so its log can say why a drop
 * happened, not only that it did, and onehop observe can show it. */
struct observe_event {
	__u32 kind;   /* enum observe_kind */
	__u32 reason; /* enum drop_reason, for OBSERVE_DROP */
	__u32 ifindex;
	__u32 farm; /* whose budget it spent (observe.h): the vif's VM's farm, else the source's */
	__be32 saddr;
	__be32 daddr;
	__be16 sport; /* TCP/UDP ports, or the ICMP echo id as both; 0 when unknown */
	__be16 dport;
	__u8 proto;
	__u8 _pad;
	__u16 ethertype;
	__u8 smac[ETH_ALEN];
	__u16 _pad2;
};

#endif
