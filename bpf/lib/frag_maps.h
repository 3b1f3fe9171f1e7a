/* Datagrams whose first fragment this host admitted (frag.h): owned by the
 * datapath, bounded by the LRU and by FRAG_LIFETIME_NS. */
#ifndef ONEHOP_FRAG_MAPS_H
#define ONEHOP_FRAG_MAPS_H

#include "common.h"

struct frag_key {
	__be32 saddr;
	__be32 daddr;
	__be16 id;
	__u8 proto;
	__u8 _pad;
};

/* Datagrams whose first fragment was admitted: key -> when. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct frag_key);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} frag_flows SEC(".maps");

#endif
