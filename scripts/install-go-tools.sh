#!/usr/bin/env bash
# Installs the Go-built tools the tests need, each at a pinned version, into
# /usr/local/bin (make deps runs it after install-deps.sh, which installs Go).
# Idempotent: `go version -m` tells which version is there already.
set -euo pipefail
export PATH=$PATH:/usr/local/go/bin

# tool -> module@version it is built from (the module's path + the tool's)
declare -A tools=(
  [cnitool]=github.com/containernetworking/cni/cnitool@v1.2.3  # e2e: drives the CNI plugin as a runtime does
)
for tool in "${!tools[@]}"; do
  pkg=${tools[$tool]%@*} version=${tools[$tool]#*@}
  have=$(command -v "$tool" || true)
  if [ -n "$have" ] && go version -m "$have" 2>/dev/null | grep -qE "^[[:space:]]+mod[[:space:]].*[[:space:]]$version([[:space:]]|$)"; then
    continue
  fi
  if [ "$(id -u)" -ne 0 ]; then
    echo "install-go-tools: $tool $version is missing; run as root (sudo make deps) to install it" >&2
    exit 1
  fi
  echo "install-go-tools: installing $tool $version into /usr/local/bin" >&2
  GOBIN=/usr/local/bin go install "$pkg@$version"
done
