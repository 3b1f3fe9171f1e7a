package vnat

// The C lives in bpf/ (a directory without Go files). Generated .go and .o
// files are committed so a plain `go build` needs no clang.
//go:generate go tool bpf2go -cc clang-14 -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target bpfel -type vnat_tuple -type vnat_rewrite -type vnat_config -type vnat_conn_key -type vnat_conn -type vnat_helper -type vnat_counter -type vnat_dir vnat ../../bpf/vnat.c
