#!/usr/bin/env bash
# The multipath cloud-access demo (issue 11, paper 003): builds
# examples/cloud-access.yaml (user -> gw -> wan1, wan2 at 100 Mbit/s each
# -> xtr -> srv, the controller as LISP map-server), shows the mappings the
# gateway and the xTR registered, a plain-TCP download from user carried
# over both paths (bytes per path), the LISP headers tshark decodes from a
# capture on wan1, wan1 cut in the middle of a download and restored, and
# `onehop gateway status`; then tears the lab down (KEEP=1 keeps it).
#
# A step that fails stops the demo with "FAILED". The demo shows the
# figures; TestPrivilegedCloudAccessUsesBothPathsAndSurvivesACut (test/e2e)
# asserts them: both paths used, LISP on the wire, the content intact across
# the cut (scripts/lib.sh).
ONEHOP=${1:-bin/onehop}
TOPO=${2:-examples/cloud-access.yaml}
LAB=cloud
source "$(dirname "$0")/lib.sh"
SRV=10.88.0.10

TMP=$(mktemp -d)
cleanup() {
  stop_bg
  if [ "${KEEP:-}" != 1 ]; then lab_down_quietly; fi
  rm -rf "$TMP"
}
trap cleanup EXIT

# The server: SIZE random bytes to each connection, over MPTCP (protocol 262).
cat > "$TMP/server.py" <<'PY'
import socket, sys, os, hashlib
data = os.urandom(int(sys.argv[2]))
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM, 262)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(16)
print(hashlib.sha256(data).hexdigest(), flush=True)
while True:
    c, _ = s.accept(); c.sendall(data); c.close()
PY
# The user's client: plain TCP, nothing to configure.
cat > "$TMP/client.py" <<'PY'
import socket, sys, hashlib, time
t = time.time()
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)
h, n = hashlib.sha256(), 0
while True:
    b = s.recv(1 << 20)
    if not b: break
    h.update(b); n += len(b)
dt = time.time() - t
print("%d bytes sha256 %s in %.2f s: %.0f Mbit/s" % (n, h.hexdigest(), dt, n * 8 / dt / 1e6), flush=True)
PY
chmod 644 "$TMP"/*.py

lab_up "$TOPO" "the cloud-access lab"
show "$ONEHOP" lab status --lab "$LAB"

say "The map-server's mappings: the xTR registered 10.88.0.0/24 behind one RLOC per path, the gateway each path's EID"
op lisp map list

# wan_bytes: what each WAN router sent towards the gateway (the download's direction).
wan_bytes() {
  for w in wan1 wan2; do
    on "$w" ip -s -j link show dev gw0 | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["stats64"]["tx"]["bytes"])'
  done
}
per_path() { # before... after...
  note "wan1 carried $((($3 - $1) / 1000000)) MB, wan2 $((($4 - $2) / 1000000)) MB"
}
# intact OUT SUM: whether the client's hash (in OUT) is the server's, SUM.
intact() {
  if grep -q "sha256 $2" <<<"$1"; then note "content intact (sha256 ${2:0:16}...)"; else note "content DIFFERS from the server's (sha256 ${2:0:16}...)"; fi
}
# download PORT SUM: user downloads from srv:PORT through the gateway; its
# figures, whether the content is the server's, what each WAN carried.
download() {
  local b1 b2 a1 a2 out
  read -r b1 b2 <<<"$(wan_bytes | xargs)"
  printf '$ onehop lab exec user -- python3 client.py %s %s\n' "$SRV" "$1"
  out=$(on user python3 "$TMP/client.py" $SRV "$1")
  echo "$out"
  read -r a1 a2 <<<"$(wan_bytes | xargs)"
  intact "$out" "$2"
  per_path "$b1" "$b2" "$a1" "$a2"
}

say "srv serves 40 MB and 120 MB over MPTCP; the gateway takes the user's plain TCP and carries it as MPTCP"
on srv python3 "$TMP/server.py" 5201 40000000 > "$TMP/srv1" 2>&1 & BG+=($!)
on srv python3 "$TMP/server.py" 5202 120000000 > "$TMP/srv2" 2>&1 & BG+=($!)
for f in srv1 srv2; do
  for _ in $(seq 50); do [ -s "$TMP/$f" ] && break; sleep 0.2; done
  [ -s "$TMP/$f" ] || failed "the server did not start: $(cat "$TMP/$f")"
done
SUM1=$(head -1 "$TMP/srv1"); SUM2=$(head -1 "$TMP/srv2")

say "A download from user to $SRV:5201 (two 100 Mbit/s paths)"
download 5201 "$SUM1"
show "$ONEHOP" lab exec --lab "$LAB" gw -- "$ONEHOP" gateway status
say "On srv: one MPTCP connection, one subflow from each of the gateway's path EIDs (ss -M, ss -t)"
on user python3 "$TMP/client.py" $SRV 5202 > "$TMP/dl-ss" 2>&1 & dl=$!; BG+=($dl)
sleep 1.5
von srv ss -Mn state established '( sport = :5202 )'
von srv ss -tn state established '( sport = :5202 )'
wait "$dl" || true

say "LISP on the wire: a capture on wan1 (router's link to gw), decoded by tshark (lisp-data)"
on wan1 tshark -i gw0 -c 4 -f 'udp port 4341' -w "$TMP/wan1.pcap" >/dev/null 2>&1 & cap=$!; BG+=($cap)
sleep 1
on user python3 "$TMP/client.py" $SRV 5201 >/dev/null
wait "$cap" || true
show tshark -r "$TMP/wan1.pcap" -c 2 -O lisp-data -Y lisp-data
note "outer 172.31.1.x (RLOCs) around inner 10.77.0.1 <-> 10.88.0.10 (EIDs), UDP 4341, N bit and nonce"

say "A 120 MB download with wan1 cut after 2 s and restored 3 s later"
read -r b1 b2 <<<"$(wan_bytes | xargs)"
on user python3 "$TMP/client.py" $SRV 5202 > "$TMP/dl" 2>&1 & dl=$!; BG+=($dl)
sleep 2
show "$ONEHOP" lab link --lab "$LAB" wan1 down
sleep 1
show "$ONEHOP" lab exec --lab "$LAB" gw -- "$ONEHOP" gateway status
read -r c1 c2 <<<"$(wan_bytes | xargs)"
sleep 2
read -r d1 d2 <<<"$(wan_bytes | xargs)"
note "while wan1 is down: wan1 carried $((d1 - c1)) bytes, wan2 $(((d2 - c2) / 1000000)) MB"
show "$ONEHOP" lab link --lab "$LAB" wan1 up
wait "$dl" || failed "the download failed: $(cat "$TMP/dl")"
cat "$TMP/dl"
intact "$(cat "$TMP/dl")" "$SUM2"
note "the connection survived the cut"
read -r a1 a2 <<<"$(wan_bytes | xargs)"
per_path "$b1" "$b2" "$a1" "$a2"

say "wan1 is back: a new download uses both paths again"
for _ in $(seq 50); do
  "$ONEHOP" lab exec --lab "$LAB" gw -- "$ONEHOP" gateway status -o json | python3 -c 'import json,sys; sys.exit(0 if all(p["up"] for p in json.load(sys.stdin)["paths"]) else 1)' && break
  sleep 0.2
done
download 5201 "$SUM1"
show "$ONEHOP" lab exec --lab "$LAB" gw -- "$ONEHOP" gateway status
show "$ONEHOP" lisp server --api "$API"

say "Done. The lab goes down now (KEEP=1 make demo-cloud keeps it; then: $ONEHOP lab down --lab $LAB)"
