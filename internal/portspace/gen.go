package portspace

// Port space's own programs (bpf/portspace.c: the sliver links' and lo's;
// bpf/portspace_sock.c: the slivers' cgroup) load on the router's pinned
// maps (kernel.go). The C lives in bpf/ (a directory without Go files);
// generated .go and .o files are committed so a plain `go build` needs no
// clang, and CI checks they match the C.
//go:generate go tool bpf2go -cc clang-14 -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target bpfel -type portspace_uplink -type portspace_sliver -type portspace_vif -type portspace_limits -type portspace_share -type portspace_counters -type portspace_frag_key -type portspace_frag -type portspace_echo_key -type portspace_echo -type portspace_fanout_key -type portspace_share_kind -type drop_reason portspace ../../bpf/portspace.c
//go:generate go tool bpf2go -cc clang-14 -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target bpfel portspaceSock ../../bpf/portspace_sock.c

// The same built with ONEHOP_TEST_HOOKS, for tests only: every redirect is
// also logged (bpf/lib/redirect.h), so a BPF_PROG_RUN test can see where a
// frame would go. Production code never loads it.
//go:generate go tool bpf2go -cc clang-14 -cflags "-O2 -g -Wall -Werror -DONEHOP_TEST_HOOKS -I/usr/include/x86_64-linux-gnu" -target bpfel portspaceTest ../../bpf/portspace.c
