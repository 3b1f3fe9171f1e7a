#!/usr/bin/env bash
# Builds onehop's Debian package from a built binary, with dpkg-deb and no
# network: make package runs it (docs/operations.md).
#   scripts/package.sh BIN VERSION OUTDIR
# The tree is what `make install` lays out (binary, units, example
# settings, the CNI plugin's link) under /usr, plus the man pages and the
# bash/zsh/fish completions the binary writes itself. The settings in
# /etc/onehop are conffiles: an upgrade never overwrites an operator's.
set -euo pipefail
bin=${1:?usage: package.sh BIN VERSION OUTDIR}
version=${2:?usage: package.sh BIN VERSION OUTDIR}
out=${3:?usage: package.sh BIN VERSION OUTDIR}
cd "$(dirname "$0")/.."
for tool in dpkg-deb gzip make; do
  command -v "$tool" >/dev/null || { echo "package: $tool is missing (make deps installs it)" >&2; exit 1; }
done

# A Debian version starts with a digit: v1.2.3 -> 1.2.3; anything else (a
# commit, "dev") is a pre-release of 0.0.0, ordered before any release.
deb_version=${version#v}
[[ $deb_version =~ ^[0-9]+\.[0-9] ]] || deb_version="0.0.0~$deb_version"
deb_version=$(tr -c 'A-Za-z0-9.+~\n' '+' <<<"$deb_version")
arch=$(dpkg --print-architecture 2>/dev/null || go env GOARCH)

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root="$stage/onehop"
make -s -o build install BIN="$bin" DESTDIR="$root" PREFIX=/usr UNITDIR=/lib/systemd/system SYSCONFDIR=/etc >/dev/null

man="$root/usr/share/man/man1"
"$bin" man "$man"
gzip -9n "$man"/*.1
install -d "$root/usr/share/bash-completion/completions" "$root/usr/share/zsh/vendor-completions" "$root/usr/share/fish/vendor_completions.d"
"$bin" completion bash >"$root/usr/share/bash-completion/completions/onehop"
"$bin" completion zsh >"$root/usr/share/zsh/vendor-completions/_onehop"
"$bin" completion fish >"$root/usr/share/fish/vendor_completions.d/onehop.fish"
install -D -m 0644 README.md "$root/usr/share/doc/onehop/README.md"

install -d -m 0755 "$root/DEBIAN"
size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)
cat >"$root/DEBIAN/control" <<CONTROL
Package: onehop
Version: $deb_version
Architecture: $arch
Maintainer: onehop developers <onehop@localhost>
Section: net
Priority: optional
Installed-Size: $size
Recommends: iproute2, nftables
Description: host-based network virtualization with one-hop routing in eBPF
 One binary: the controller (intent, allocation, embedded etcd, REST API),
 the per-host agent (the eBPF datapath on every VM's vif and the uplink),
 the operator's CLI, the CNI plugin, the access gateway and the xTR.
 The systemd units are installed but not enabled: edit /etc/onehop/*.env,
 then systemctl enable --now onehop-controller onehop-agent.
CONTROL
(cd "$root" && find etc -type f | sed 's|^|/|' | sort) >"$root/DEBIAN/conffiles"

mkdir -p "$out"
deb="$out/onehop_${deb_version}_${arch}.deb"
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
echo "$deb"
