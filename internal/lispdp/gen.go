package lispdp

// The C lives in bpf/ (a directory without Go files). Generated .go and .o
// files are committed so a plain `go build` needs no clang.
//go:generate go tool bpf2go -cc clang-14 -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target bpfel -type lisp_path -type lisp_eid_key -type lisp_eid -type lisp_tunnel_key -type lisp_stats -type lisp_counter -type lisp_path_flag -type lisp_eid_flag lisp ../../bpf/lisp.c
