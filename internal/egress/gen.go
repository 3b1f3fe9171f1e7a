package egress

// Egress's map records, generated from the C the router's programs are
// built from (bpf/lib/egress_maps.h, through bpf/egress_types.c, an object
// never loaded: the maps are the router's). Generated .go and .o files are
// committed so a plain `go build` needs no clang; CI checks they match the C.
//go:generate go tool bpf2go -cc clang-14 -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target bpfel -type egress_addr -type egress_owner -type egress_vm -type egress_to_key -type egress_map -type egress_flow_key -type egress_counters -type egress_publish_key -type egress_publish -type egress_addr_kind -type egress_owner_kind egress ../../bpf/egress_types.c
