/* Frames for the agent (struct slowpath_event in common.h): DHCP requests,
 * held packets, answers to the agent's own ARP questions. Owned by the
 * datapath; a record lives until the agent reads it. */
#ifndef ONEHOP_SLOWPATH_MAPS_H
#define ONEHOP_SLOWPATH_MAPS_H

#include "common.h"

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} slowpath SEC(".maps");

#endif
