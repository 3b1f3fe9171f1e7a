/* Every map of the virtual router, one header per concern. Pinned by name
 * so traffic keeps flowing while the agent restarts. A feature's maps live
 * in its own bpf/lib/FEATURE_maps.h, included by its FEATURE.h; this list
 * is for the headers that predate the split. */
#ifndef ONEHOP_MAPS_H
#define ONEHOP_MAPS_H

#include "node_maps.h"
#include "counter_maps.h"
#include "endpoint_maps.h"
#include "mapping_maps.h"
#include "policy_maps.h"
#include "conntrack_maps.h"
#include "broadcast_maps.h"
#include "slowpath_maps.h"

#endif
