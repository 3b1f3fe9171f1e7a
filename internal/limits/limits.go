// Package limits holds the capacities the datapath is built with, so the controller can refuse what would not fit.
package limits

// MaxVMsPerHost is the number of VMs one host's datapath holds (MAX_ENDPOINTS in bpf).
const MaxVMsPerHost = 4096
