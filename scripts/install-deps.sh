#!/usr/bin/env bash
# Installs what onehop needs to build, test, demo and benchmark, from Debian's
# packages. Idempotent: does nothing when everything is there already.
set -euo pipefail

# command -> Debian package that provides it
declare -A need=(
  [clang-14]=clang-14        # go generate: compiles bpf/*.c
  [llvm-strip]=llvm          # bpf2go strips the objects it embeds
  [clang-format-14]=clang-format-14  # make lint: bpf/ stays in .clang-format's style (same LLVM as clang-14)
  [ip]=iproute2
  [bridge]=iproute2        # e2e: the lab fabric's ports are locked, each bound to its MAC
  [ping]=iputils-ping
  [iperf3]=iperf3
  [tcpdump]=tcpdump
  [tshark]=tshark
  [curl]=curl
  [nsenter]=util-linux
  [udhcpc]=udhcpc
  [traceroute]=traceroute
  [python3]=python3          # e2e and demo: raw frames, UDP senders, JSON
  [etcd]=etcd-server       # an external etcd cluster in tests
  [etcdctl]=etcd-client    # e2e: etcd refuses an agent's certificate another host's keys; a cascade delete leaves no key
  [nft]=nftables           # bench: the NAT baseline port-space isolation is compared with
  [ethtool]=ethtool        # vnat tests: checksum offload off, so the kernel verifies translated checksums
  [mptcpize]=mptcpize      # cloud-access bench: iperf3 servers speak MPTCP
  [socat]=socat            # e2e: an interactive program (socat) keeps its connection across a VNAT move
  [systemd-analyze]=systemd # docs tests: the installed units pass systemd-analyze verify
  [qemu-system-x86_64]=qemu-system-x86  # e2e: a real QEMU guest on a tap (TCG: no KVM needed)
  [cpio]=cpio              # e2e: packs the QEMU guest's initramfs
  [modprobe]=kmod          # e2e: docs/deploy.md's walkthrough lists the guest's virtio-net modules with it
  [virt-xml-validate]=libvirt-clients  # docs test: the libvirt <interface> XML validates against libvirt's schema
  [xmllint]=libxml2-utils  # virt-xml-validate runs it (a Recommends, which install-deps does not install)
  [dpkg-deb]=dpkg          # make package: the Debian package, read back by its test
  [gzip]=gzip              # make package: the man pages
)
missing=()
for cmd in "${!need[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || missing+=("${need[$cmd]}")
done
# libbpf headers for the BPF C (bpf_helpers.h & co).
[ -f /usr/include/bpf/bpf_helpers.h ] || missing+=(libbpf-dev)
# bench: the reference CNI plugins (bridge, host-local) the onehop plugin is compared with.
[ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/host-local ] || missing+=(containernetworking-plugins)
# linux uapi headers for asm/ types under the multiarch include path.
[ -d /usr/include/x86_64-linux-gnu/asm ] || missing+=(linux-libc-dev)
# The QEMU guest's kernel and its virtio modules (a file, not a command:
# the host's own kernel is not used), and a static busybox for its /init.
compgen -G '/boot/vmlinuz-*' >/dev/null || missing+=(linux-image-amd64)
dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q 'ok installed' || missing+=(busybox-static)

if ! command -v go >/dev/null 2>&1 && [ ! -x /usr/local/go/bin/go ]; then
  missing+=(golang-go)
fi

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: missing ${missing[*]}; run as root (sudo make deps) to install them" >&2
  exit 1
fi
echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
# tshark asks whether non-root users may capture; the answer does not matter here.
echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections 2>/dev/null || true
apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null 2>&1 || {
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends "${missing[@]}"
}
