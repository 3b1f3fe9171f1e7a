package tap

// TAP's map records, generated from the C the router's programs are built
// from (bpf/lib/tap_maps.h, through bpf/tap_types.c, an object never
// loaded: the maps are the router's). A test holds them to the router's
// maps. Generated .go and .o files are committed so a plain `go build`
// needs no clang; CI checks they match the C.
//go:generate go tool bpf2go -cc clang-14 -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target bpfel -type tap_key -type tap_bits -type tap_rule -type tap_target -type tap_limits -type tap_counters -type tap_role -type tap_side -type tap_key_kind -type tap_encap tap ../../bpf/tap_types.c
