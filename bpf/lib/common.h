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

/* A VM on this host, keyed by its IPv4 address in network order. The agent
 * installs exactly the host's own VMs; where other VMs live is learned by
 * the ARP engine into the mapping table below. */
struct endpoint {
	__u32 ifindex;      /* its vif in this host's namespace */
	__u8 mac[ETH_ALEN]; /* the VM's virtual MAC, never seen on the wire */
	__u8 firewall;      /* 1: the VM has its own firewall (in `firewalls`) */
	__u8 _pad;
};

/* One entry of the per-node mapping table (paper §2, "The VNET ARP engine"):
 * the host that holds a remote VM, learned from ARP replies and from the
 * fabric's own traffic. A fixed-size LRU: a lookup refreshes an entry, and a
 * full table forgets its least recently used one. An all-zero host_mac means
 * "asked, not yet answered": it rate-limits the fabric ARP for that address. */
struct mapping {
	__u8 host_mac[ETH_ALEN];
	__u16 held;         /* while asking: packets handed to the agent since the last ask */
	__u64 confirmed_ns; /* last ARP reply or announcement (or the last ask, while unanswered) */
	__u64 used_ns;      /* last packet sent with it, in steps of MAPPING_USE_STEP_NS */
};

#define MAPPING_USE_STEP_NS 1000000000ULL
/* How often a VM's unanswered ARP may go to the fabric for one address. */
#define MAPPING_ASK_INTERVAL_NS 1000000000ULL
/* Packets for one unmapped address handed to the agent per ask interval
 * (the agent holds as many): beyond, they are dropped in the kernel. */
#define HOLD_PER_ASK 16

/* Per-farm switches set by the farm's owner; an array slot per farm id. */
#define FARM_PROXY_ARP 1
struct farm_config {
	__u32 flags;
};

/* What a VM behind a vif is allowed to send as (anti-spoofing, step 1). */
struct vif_info {
	__be32 ip;
	__u8 mac[ETH_ALEN];
	__u8 firewall; /* 1: the VM has its own firewall: saves a lookup per packet otherwise */
	__u8 _pad;
};

/* Per-node facts the programs need; a single-slot array. */
struct node_config {
	__u32 uplink_ifindex;
	__u8 uplink_mac[ETH_ALEN];
	__u16 _pad;
	__be32 vm_net;  /* the tenant address space (10.0.0.0/8) ... */
	__be32 vm_mask; /* ... so the uplink can tell VM traffic from management */
	/* Moves on whenever rules or firewalls change: a flow admitted under an
	 * older epoch is checked again against the rules in force. */
	__u32 policy_epoch;
};

/* Why a packet was dropped. Each reason is its own metric label; the Go side
 * names them from this enum, so a new reason needs no hand-written mapping. */
enum drop_reason {
	DROP_NONE = 0,
	DROP_MALFORMED,          /* truncated or inconsistent headers */
	DROP_UNSUPPORTED,        /* EtherType we do not carry: IPv6, ... (VLAN tags: DROP_VLAN_TAGGED) */
	DROP_UNKNOWN_VIF,        /* frame from a vif the agent has not configured */
	DROP_SPOOFED_MAC,        /* VM sent with a source MAC not its own */
	DROP_SPOOFED_IP,         /* VM sent with a source IPv4 not its own */
	DROP_NO_ROUTE,           /* destination is no VM in the mapping table */
	DROP_NO_UPLINK,          /* remote destination but uplink not configured */
	DROP_ARP_SPOOFED,        /* ARP sender MAC/IP not the VM's own */
	DROP_ARP_NOT_REQUEST,    /* VM sent an ARP reply or other op: never leaves */
	DROP_ARP_UNKNOWN_TARGET, /* ARP for an address no VM holds */
	DROP_ARP_OTHER_SUBNET,   /* ARP for an address outside the asker's subnet */
	DROP_FABRIC_UNKNOWN_SRC, /* from the fabric, source VM mapped to another host, or local here */
	DROP_FABRIC_NOT_LOCAL,   /* from the fabric, destination VM not on this host */
	DROP_NOT_VISIBLE,        /* between subnets or farms without a rule allowing it */
	DROP_TTL_EXCEEDED,       /* routed between subnets with TTL 1: cannot take the gateway hop */
	DROP_AGENT_BUSY,         /* for the agent (DHCP), but its ring buffer was full */
	DROP_FIREWALL_IN,        /* the receiving VM's firewall refused it */
	DROP_FIREWALL_OUT,       /* the sending VM's firewall refused it */
	DROP_NO_MEMBERS,         /* a farm/subnet broadcast for which this host has no VM */
	DROP_ROGUE_DHCP,         /* a VM acting as DHCP server: only the host answers DHCP */
	DROP_ARP_NOT_HERE,       /* fabric ARP for a VM this host does not hold: multicast reaches every host */
	DROP_FABRIC_ARP_CONFLICT, /* a host claims, by ARP, a VM that lives on this host */
	DROP_UNRESOLVED,         /* for an address being resolved, beyond what the agent holds per second */
	DROP_VLAN_TAGGED,        /* a VM sent an 802.1Q/802.1ad tagged frame: no VM picks VLANs or priorities on the underlay */
	DROP_FABRIC_UNKNOWN_HOST, /* from the fabric, into tenant space, from a MAC that is no known host's uplink */
	DROP_FABRIC_NOT_TENANT,  /* from the fabric, a source no VM can hold: outside the tenant space, or a subnet's .0, .1 or .255 */
	DROP_FABRIC_NOT_BROADCAST, /* to a scope's fabric multicast MAC, but not a broadcast or multicast of that scope */
	DROP_ARP_UNSOLICITED,    /* a fabric ARP reply to this host for an address it did not ask about */
	DROP_CLAIM_LIMITED,      /* a host claims a VM mapped elsewhere again within a second: the agent is already checking */
	DROP_FRAG_NO_FIRST,      /* a later fragment whose first fragment this host did not admit (or admitted too long ago) */
	DROP_OVER_SHARE,         /* the VM is over its share of a table or the slow path every tenant shares */
	DROP_REASON_MAX,
};

/* What happened to packets that were not dropped. */
enum forward_path {
	FWD_LOCAL = 0,     /* VM to VM on this host */
	FWD_TO_FABRIC,     /* VM to a VM on another host, out the uplink */
	FWD_FROM_FABRIC,   /* from another host into a local VM */
	FWD_ARP_REPLY,     /* ARP answered in the datapath */
	FWD_HOST_STACK,    /* management traffic handed to the host's own stack */
	FWD_GATEWAY_REPLY, /* echo request to the virtual gateway, answered in the datapath */
	FWD_ROUTED,        /* crossed the virtual gateway to another subnet or farm (also counted by path) */
	FWD_TO_AGENT,      /* handed to the agent to answer (DHCP) */
	FWD_BROADCAST,     /* a broadcast/multicast copy delivered to a VM of its scope */
	FWD_ARP_TO_FABRIC, /* a VM's ARP the mapping table could not answer, sent to its scope's multicast address */
	FWD_ARP_ANSWERED,  /* a fabric ARP for one of this host's VMs, answered in the datapath */
	FWD_ARP_LEARNED,   /* a fabric ARP reply or announcement taken into the mapping table */
	FWD_HELD,          /* a packet for an address not yet mapped, held by the agent while it resolves */
	FWD_PATH_MAX,
};

/* A visibility rule (paper §2, step 2): traffic from one subnet to another
 * that the farm owner (and, across farms, both owners) allowed. proto 0 and
 * port 0 are wildcards; port is the destination port, host order. */
struct vis_key {
	__u8 src_farm;
	__u8 src_subnet;
	__u8 dst_farm;
	__u8 dst_subnet;
	__u8 proto;
	__u8 _pad;
	__u16 port;
};

/* A VM's own firewall (paper §2, per-VM policies): ordered rules per
 * direction, first match wins, else the direction's default. Enforced on the
 * VM's host, outside the VM, so a compromised VM cannot lift it. */
#define FW_MAX_RULES 16
#define FW_IN 0
#define FW_OUT 1

struct fw_key {
	__be32 vm;
	__u8 dir;
	__u8 index;
	__u16 _pad;
};

struct fw_rule {
	__be32 net;     /* remote address ... */
	__be32 mask;    /* ... and prefix mask */
	__u16 port_lo;  /* VM-side port for in, remote port for out; 0: any */
	__u16 port_hi;
	__u8 proto;     /* 0: any */
	__u8 allow;
	__u16 _pad;
};

struct fw_policy {
	__u8 count[2];         /* rules per direction (FW_IN, FW_OUT) */
	__u8 default_allow[2];
};

/* One direction of a flow a rule allowed; its reverse lets replies in. */
struct ct_key {
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 _pad[3];
};

struct ct_entry {
	__u64 last_seen_ns;
	__u32 epoch; /* the node's policy_epoch when the flow was last admitted */
	__u32 _pad;
};

/* The VMs of one scope on this host: a subnet (subnet != 0) or a whole farm
 * (subnet == 0), for scoped broadcast and multicast (paper §2). */
#define MAX_SCOPE_MEMBERS 32
struct scope_key {
	__u8 farm;
	__u8 subnet;
	__u16 _pad;
};

struct scope_members {
	__u32 count;
	__u32 ifindex[MAX_SCOPE_MEMBERS];
	__be32 ip[MAX_SCOPE_MEMBERS];
};

/* A frame the agent must handle, copied whole (up to SLOWPATH_MAX bytes). */
#define SLOWPATH_MAX 1536
enum slowpath_kind {
	SLOW_DHCP = 0,  /* a VM's DHCP request: the agent answers it */
	SLOW_HOLD,      /* a routed, admitted frame whose destination host is unknown:
			 * the agent resolves it and sends the frame on */
	SLOW_ARP_REPLY, /* a fabric ARP reply to the agent's own question */
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

/* Sent to the agent through a ring buffer so its log can say why a drop
 * happened, not only that it did. */
struct drop_event {
	__u32 reason;
	__u32 ifindex;
	__be32 saddr;
	__be32 daddr;
	__u8 smac[ETH_ALEN];
	__u16 ethertype;
};

#endif
