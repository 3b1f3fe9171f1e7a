/* North-south egress's maps (egress.h, docs/north-south.md).
 *
 * The host's uplink address is one lease space (internal/lease): slivers'
 * leases, the host's ephemeral range and each egress VM's slice are ranges
 * of it that never overlap. Reconciled by the agent (internal/egress): the
 * host addresses (egress_addrs), the port -> owner array (egress_ports),
 * the egress VMs and their slices (egress_vms, egress_slots) and the
 * destinations each may reach (egress_to).
 * Owned by the datapath: the translations (egress_state, one slot per
 * protocol and port: a port of a VM's slice holds at most one of its flows,
 * so a VM's state can never outgrow its slice nor touch another's;
 * egress_flows, its index by the VM's own 5-tuple, one entry per claimed
 * port), fragment records and per-VM counters.
 *
 * A published port (publish.h) is one more owner kind in egress_ports
 * (EGRESS_OWNER_PUBLISHED, a lease like a slice, with the VM's port and
 * protocol), and egress_published finds it again from the VM's end.
 *
 * A floating address is one more kind of egress_addrs entry
 * (EGRESS_ADDR_FLOATING, floating.h), steering the whole address to its
 * VM's slot. */
#ifndef ONEHOP_EGRESS_MAPS_H
#define ONEHOP_EGRESS_MAPS_H

#include "common.h"

/* internal/limits: egress translates on uplink 0 (the address a host's
 * default route leaves by); more uplinks are more egress_addrs entries and
 * a larger port array. */
#define EGRESS_UPLINKS 1
#define EGRESS_PORTS (EGRESS_UPLINKS * 65536)
#define EGRESS_PROTOS 3 /* TCP, UDP, ICMP echo */
#define EGRESS_MAX_VMS 16384
#define EGRESS_MAX_TO 65536 /* destination prefixes, all VMs together */
/* Fragment records: at most EGRESS_FRAGS_PER_VM per VM (egress_frag_places),
 * so the table holds every VM's at once: a host's 65,536 ports give at
 * most 4,096 slices of the smallest size (16), 16 records each. One VM's
 * fragments replace only its own records, never another VM's. */
#define EGRESS_FRAGS_PER_VM 16
#define EGRESS_FRAG_MAX (4096 * EGRESS_FRAGS_PER_VM)
#define EGRESS_FRAG_PLACES (EGRESS_MAX_VMS * EGRESS_FRAGS_PER_VM)
#define EGRESS_MAX_PUBLISHED 16384 /* published ports, all VMs of a host together */

/* What an address of this host is to egress. */
enum egress_addr_kind {
	EGRESS_ADDR_NONE = 0,
	EGRESS_ADDR_UPLINK,   /* an uplink's own address, shared by port (egress_ports) */
	EGRESS_ADDR_FLOATING, /* a VM's floating address, whole (floating.h): slot is the VM's */
};

struct egress_addr {
	__u32 kind;   /* enum egress_addr_kind */
	__u32 uplink; /* its uplink's index */
	__u32 slot;   /* for a whole-address kind: the VM's slot */
};

/* Who owns a port of an uplink address. */
enum egress_owner_kind {
	EGRESS_OWNER_HOST = 0,  /* nobody: the host's own stack */
	EGRESS_OWNER_SLICE,     /* a VM's egress slice: live translations only */
	EGRESS_OWNER_PUBLISHED, /* a VM's published port: its port and protocol only (publish.h) */
};

struct egress_owner {
	__u32 kind; /* enum egress_owner_kind */
	__u32 slot;
	__be16 port; /* EGRESS_OWNER_PUBLISHED: the VM's own port */
	__u8 proto;  /* ... and the one protocol published there */
	__u8 _pad;
};

/* A published port from the VM's end: its address, port and protocol. */
struct egress_publish_key {
	__be32 vm_addr;
	__be16 vm_port;
	__u8 proto;
	__u8 _pad;
};

struct egress_publish {
	__u32 slot;
	__be16 public_port; /* of its host's uplink-0 address */
	__u16 _pad;
};

/* An egress VM, by slot: its own address, the host address and uplink it
 * leaves by, and its slice [lo, hi] of that address's ports; or, when
 * floating is set, the floating address it leaves with instead (lo and hi
 * 0 for a VM of a farm without egress). */
struct egress_vm {
	__be32 vm_addr;
	__be32 host_addr;
	__u32 uplink_ifindex;
	__u32 uplink;
	__u16 lo;
	__u16 hi;
	__be32 floating; /* its floating address, or 0 (floating.h) */
	/* 1: its destinations hold 0.0.0.0/0 (the default), so egress_out
	 * does not look egress_to up: an LPM lookup on every packet, the
	 * slower the more egress VMs a host has. */
	__u32 to_any;
};

/* A VM may reach addr when (slot, addr) matches a prefix of its list. */
struct egress_to_key {
	__u32 prefixlen; /* 32 (the slot) + the prefix's length */
	__u32 slot;      /* network order, as an LPM key's bytes are matched */
	__be32 addr;
};

/* One translation: the VM's end and the remote end of the flow holding a
 * port of the slice. expires_ns (the coarse clock) is the claim: a port
 * whose expires_ns has passed is free, and is taken by compare-and-swap. */
struct egress_map {
	struct bpf_spin_lock lock; /* held only to claim the port */
	__u32 flags;               /* EGRESS_REPLIED, EGRESS_CLOSING */
	__u64 expires_ns;
	__be32 vm_addr;
	__be32 remote;
	__be16 vm_port;
	__be16 remote_port;
	__u32 fin_end; /* the sequence number just past the VM's FIN (host order) */
};

/* The VM's own 5-tuple, to the port its flow holds (host order). */
struct egress_flow_key {
	__be32 vm_addr;
	__be32 remote;
	__be16 vm_port;
	__be16 remote_port;
	__u8 proto;
	__u8 _pad[3];
};

/* A fragmented datagram: a VM's own to remote (dir EGRESS_FRAG_OUT, addr the
 * VM's), or one from remote to a host address (EGRESS_FRAG_IN, addr the
 * host's), whose first fragment was translated. */
struct egress_frag_key {
	__be32 remote;
	__be32 addr;
	__be16 id;
	__u8 proto;
	__u8 dir;
};

struct egress_frag {
	__u64 when_ns;
	__u32 slot;
	__u32 _pad;
};

/* A VM's egress traffic, per CPU, by slot. */
struct egress_counters {
	__u64 packets_out;
	__u64 bytes_out;
	__u64 packets_in;
	__u64 bytes_in;
	__u64 flows;       /* translations opened (a port of the slice claimed) */
	__u64 refused;     /* new flows refused: no free port in the slice */
	__u64 not_allowed; /* to a destination its list does not hold */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, __be32);
	__type(value, struct egress_addr);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} egress_addrs SEC(".maps");

/* uplink*65536 + port -> owner: one array lookup steers a reply. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, EGRESS_PORTS);
	__type(key, __u32);
	__type(value, struct egress_owner);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} egress_ports SEC(".maps");

/* A VM's end of a published port -> its slot and public port: how its
 * replies are told from flows of its own (publish.h). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, EGRESS_MAX_PUBLISHED);
	__type(key, struct egress_publish_key);
	__type(value, struct egress_publish);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} egress_published SEC(".maps");

/* VM address -> slot. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, EGRESS_MAX_VMS);
	__type(key, __be32);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} egress_vms SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, EGRESS_MAX_VMS + 1);
	__type(key, __u32);
	__type(value, struct egress_vm);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} egress_slots SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, EGRESS_MAX_TO);
	__type(key, struct egress_to_key);
	__type(value, __u8);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} egress_to SEC(".maps");

/* proto index * EGRESS_PORTS + uplink*65536 + port -> its translation. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, EGRESS_PROTOS * EGRESS_PORTS);
	__type(key, __u32);
	__type(value, struct egress_map);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} egress_state SEC(".maps");

/* At most one entry per claimed port: bounded by the slices, never full. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, EGRESS_PROTOS * EGRESS_PORTS);
	__type(key, struct egress_flow_key);
	__type(value, __u32);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} egress_flows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, EGRESS_FRAG_MAX);
	__type(key, struct egress_frag_key);
	__type(value, struct egress_frag);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} egress_frags SEC(".maps");

/* Per slot, EGRESS_FRAGS_PER_VM places: the key of the VM's record in each
 * (by IP id), so a VM's new record replaces its own older one in that
 * place (egress_frag_note). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, EGRESS_FRAG_PLACES);
	__type(key, __u32);
	__type(value, struct egress_frag_key);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} egress_frag_places SEC(".maps");

/* Per slot: where the VM's next claim starts, just past its last one, so
 * ports are taken in turn and the next tried is the one claimed longest
 * ago: the likeliest to have expired. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, EGRESS_MAX_VMS + 1);
	__type(key, __u32);
	__type(value, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} egress_cursors SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, EGRESS_MAX_VMS + 1);
	__type(key, __u32);
	__type(value, struct egress_counters);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} egress_stats SEC(".maps");

#endif
