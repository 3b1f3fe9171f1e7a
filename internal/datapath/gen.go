// Package datapath is the virtual router in the kernel: it loads the vif and
// uplink programs, attaches them with tcx, and keeps their maps equal to a
// node's desired state. The programs hold every stage's maps, pinned; a
// feature with programs of its own loads them on those maps
// (internal/portspace).
package datapath

// The C lives in bpf/ (a directory without Go files: Go refuses .c files in
// a package without cgo). Generated .go and .o files are committed so a
// plain `go build` needs no clang; CI checks they match the C.
//go:generate go tool bpf2go -cc clang-14 -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target bpfel -type endpoint -type vif_info -type node_config -type drop_reason -type forward_path -type observe_event -type observe_kind -type observe_limits -type observe_bucket -type vis_key -type slowpath_event -type slowpath_kind -type mapping -type farm_config -type fw_key -type fw_rule -type fw_policy -type fw_policy_key -type scope_key -type scope_info -type member_key -type scope_member -type feature_bit -type share_limits -type vm_share -type share_kind -type host_key -type vif_kind -type guest_mark -type trace_record -type trace_vis -type trace_fw -type trace_ct -type redirect_kind vif ../../bpf/vif.c
//go:generate go tool bpf2go -cc clang-14 -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target bpfel uplink ../../bpf/uplink.c

// The same programs built with ONEHOP_TEST_HOOKS, for tests only: every
// redirect and clone is also logged (bpf/lib/redirect.h), so a BPF_PROG_RUN
// test can see where a frame would go. Production code never loads them.
//go:generate go tool bpf2go -cc clang-14 -cflags "-O2 -g -Wall -Werror -DONEHOP_TEST_HOOKS -I/usr/include/x86_64-linux-gnu" -target bpfel -type redirect_trace -type redirect_kind vifTest ../../bpf/vif.c
//go:generate go tool bpf2go -cc clang-14 -cflags "-O2 -g -Wall -Werror -DONEHOP_TEST_HOOKS -I/usr/include/x86_64-linux-gnu" -target bpfel uplinkTest ../../bpf/uplink.c
