#!/usr/bin/env bash
# Builds onehop's Debian package from a built binary, with dpkg-deb and no
# network: make package runs it (docs/operations.md).
#   scripts/package.sh BIN VERSION OUTDIR
# The tree is what `make install` lays out (binary, units, example
# settings, the CNI plugin's link) under /usr, plus the man pages and the
# bash/zsh/fish completions the binary writes itself. The settings in
# /etc/onehop are conffiles: an upgrade never overwrites an operator's.
# Maintainer scripts reload systemd when the units come or go, start
# nothing (the operator enables the units once the settings are edited),
# restart nothing on an upgrade (docs/operations.md upgrades host by host),
# and stop the services when the package is removed. The man pages are
# dated by the commit (SOURCE_DATE_EPOCH): two builds make the same pages.
set -euo pipefail
bin=${1:?usage: package.sh BIN VERSION OUTDIR}
version=${2:?usage: package.sh BIN VERSION OUTDIR}
out=${3:?usage: package.sh BIN VERSION OUTDIR}
cd "$(dirname "$0")/.."
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || true)}
export SOURCE_DATE_EPOCH
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

# The maintainer scripts. dpkg gives them DPKG_ROOT (empty: the running
# system); systemctl is asked only where systemd runs (not in a chroot or
# an image build). The agent stops before the controller it talks to;
# stopping it detaches nothing (the datapath is pinned, docs/deploy.md).
units="onehop-agent.service onehop-controller.service"
cat >"$root/DEBIAN/postinst" <<'SCRIPT'
#!/bin/sh
# The units are new or changed: systemd rereads them. Nothing is started
# (enable them once /etc/onehop/*.env is edited) and, on an upgrade,
# nothing restarted: docs/operations.md upgrades one host at a time.
set -e
if [ "$1" = configure ] && [ -d "$DPKG_ROOT/run/systemd/system" ]; then
  systemctl --system daemon-reload >/dev/null || true
fi
SCRIPT
cat >"$root/DEBIAN/prerm" <<SCRIPT
#!/bin/sh
# Removed (not upgraded): the services stop before their binary goes.
set -e
if [ "\$1" = remove ] && [ -d "\$DPKG_ROOT/run/systemd/system" ]; then
  systemctl --system stop $units >/dev/null || true
fi
SCRIPT
cat >"$root/DEBIAN/postrm" <<SCRIPT
#!/bin/sh
# The units are gone: systemd forgets them. Purged: the links that
# enabled them go too (removed only, they stay for a reinstall).
set -e
case "\$1" in
purge)
  for u in $units; do
    rm -f "\$DPKG_ROOT"/etc/systemd/system/*.wants/"\$u"
  done
  ;;
esac
if { [ "\$1" = remove ] || [ "\$1" = purge ]; } && [ -d "\$DPKG_ROOT/run/systemd/system" ]; then
  systemctl --system daemon-reload >/dev/null || true
fi
SCRIPT
chmod 0755 "$root/DEBIAN/postinst" "$root/DEBIAN/prerm" "$root/DEBIAN/postrm"

mkdir -p "$out"
deb="$out/onehop_${deb_version}_${arch}.deb"
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
echo "$deb"
