package datapath

import (
	"bytes"
	"encoding/binary"
	"fmt"
)

// Kinds of ObserveEvent (enum observe_kind in bpf/lib/common.h).
const (
	ObserveDrop = uint32(vifObserveKindOBSERVE_DROP)
	ObserveFlow = uint32(vifObserveKindOBSERVE_FLOW)
)

// The datapath's default event bounds (bpf/lib/observe_maps.h), per farm
// and CPU: what applies while ObserveLimits leave a field 0.
const (
	ObserveNsPerEvent = 1_000_000
	ObserveBurst      = 256
)

// DecodeObserveEvent reads one drop_events record.
func DecodeObserveEvent(raw []byte) (ObserveEvent, error) {
	var ev ObserveEvent
	if err := binary.Read(bytes.NewReader(raw), binary.NativeEndian, &ev); err != nil {
		return ev, fmt.Errorf("observe event record of %d bytes: %w", len(raw), err)
	}
	return ev, nil
}

// SetObserve writes the event bounds and the switch that publishes
// admitted flows (observe_config).
func (k *Kernel) SetObserve(l ObserveLimits) error {
	if err := k.vif.ObserveConfig.Put(uint32(0), l); err != nil {
		return fmt.Errorf("write observe_config: %w", err)
	}
	return nil
}

// ObserveLost returns, per farm id (its budget slot: observe_maps.h), the events the datapath could not
// publish (over the farm's budget, or the ring full), summed over CPUs;
// farms that lost none are left out.
func (k *Kernel) ObserveLost() (map[uint32]uint64, error) {
	out := map[uint32]uint64{}
	var key uint32
	var per []vifObserveBucket
	it := k.vif.ObserveBudget.Iterate()
	for it.Next(&key, &per) {
		var n uint64
		for _, b := range per {
			n += b.Lost
		}
		if n > 0 {
			out[key] = n
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read observe_budget: %w", err)
	}
	return out, nil
}
