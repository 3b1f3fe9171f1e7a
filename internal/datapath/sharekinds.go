package datapath

// ShareKinds names what the datapath refuses a VM for going over its share
// (Counters.Refused's kinds): the agent exports each, 0 until it happens,
// so a dashboard never has to tell absent from zero.
func ShareKinds() []string { return append([]string(nil), shareKindNames[:]...) }
