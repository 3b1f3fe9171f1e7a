/* This host's VMs and their vifs, and every farm's switches: written by the
 * agent from the node's desired state, exactly (reconciled). */
#ifndef ONEHOP_ENDPOINT_MAPS_H
#define ONEHOP_ENDPOINT_MAPS_H

#include "common.h"

/* The per-host endpoint capacity: the one limit on VMs per host
 * (internal/limits.MaxVMsPerHost, checked by the controller). */
#define MAX_ENDPOINTS 4096
#define MAX_VIFS MAX_ENDPOINTS

/* A VM on this host, keyed by its IPv4 address in network order. The agent
 * installs exactly the host's own VMs; where other VMs live is learned by
 * the ARP engine into the mapping table (mapping_maps.h). */
struct endpoint {
	__u32 ifindex;      /* its vif in this host's namespace */
	__u8 mac[ETH_ALEN]; /* the VM's virtual MAC, never seen on the wire */
	__u8 firewall;      /* 1: the VM may have its own firewall (in `firewalls`) */
	__u8 kind;          /* enum vif_kind of its vif: how a frame is delivered to it */
};

/* What a VM behind a vif is allowed to send as (anti-spoofing, step 1). */
struct vif_info {
	__be32 ip;
	__u8 mac[ETH_ALEN];
	__u8 firewall; /* 1: the VM may have its own firewall: saves a lookup per packet otherwise */
	__u8 kind;     /* enum vif_kind: the same as the VM's endpoint's, for `onehop stats` */
};

/* Per-farm switches set by the farm's owner, by farm id: only the farms of
 * this host's VMs that set one (farm ids reach 2^16 in a wide plan). */
#define FARM_PROXY_ARP 1
struct farm_config {
	__u32 flags;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_ENDPOINTS);
	__type(key, __be32);
	__type(value, struct endpoint);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} endpoints SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_VIFS);
	__type(key, __u32);
	__type(value, struct vif_info);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} vifs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_ENDPOINTS);
	__type(key, __u32);
	__type(value, struct farm_config);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} farms SEC(".maps");

#endif
