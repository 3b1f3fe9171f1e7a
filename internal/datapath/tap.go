package datapath

// Virtual TAP's map records (bpf/lib/tap_maps.h), generated from the C.
type (
	// TapKey is a key of tap_index: an address (or segment, or any) on one
	// side of the rules of one role.
	TapKey = vifTapKey
	// TapBits is a set of rule slots.
	TapBits = vifTapBits
	// TapRule is a rule by slot: its filters and its monitor's target.
	TapRule = vifTapRule
	// TapTarget is where one monitor's copies go.
	TapTarget = vifTapTarget
	// TapLimits is the copy rate each target may take.
	TapLimits = vifTapLimits
	// TapCounters are one rule's copies on one CPU.
	TapCounters = vifTapCounters
)

const (
	// Roles, sides and kinds of a TapKey.
	TapRoleCopy     = uint8(vifTapRoleTAP_ROLE_COPY)
	TapRoleRecover  = uint8(vifTapRoleTAP_ROLE_RECOVER)
	TapSideSender   = uint8(vifTapSideTAP_SIDE_SENDER)
	TapSideReceiver = uint8(vifTapSideTAP_SIDE_RECEIVER)
	TapKeyIP        = uint8(vifTapKeyKindTAP_KEY_IP)
	TapKeySegment   = uint8(vifTapKeyKindTAP_KEY_SEGMENT)
	TapKeyAny       = uint8(vifTapKeyKindTAP_KEY_ANY)
)
