#!/usr/bin/env bash
# Two peers behind two separate NATs and a bootstrap on the public side, on this machine:
#
#   public network 10.80.0.0/24 (a bridge): pub0 10.80.0.1 (peer 0, the bootstrap),
#                                           nat1 10.80.0.11, nat2 10.80.0.12 (routers)
#   nat1 ── 192.168.1.0/24 ── lan1 192.168.1.2 (peer 1)
#   nat2 ── 192.168.2.0/24 ── lan2 192.168.2.2 (peer 2)
#
# Each router masquerades its LAN (iptables MASQUERADE) and drops unsolicited packets from
# the public side, as a home router does; peers 1 and 2 cannot be dialled from outside. The
# three peers train on a ring of 3 (every pair a link; 1 ↔ 2 crosses both NATs).
#
#   sudo experiments/cluster/netns-nat.sh OUT [murmur peer options…]
#
# MURMUR: the binary (target/release/murmur). SYMMETRIC=1 makes both routers pick a random
# port for every destination (MASQUERADE --random-fully, a "symmetric" NAT), SYMMETRIC=2
# only router 2: hole punching then fails on the links that cross such a NAT, and those
# links are relayed through a reachable member (each peer says which; with --no-relay the
# run fails with an error that says why). Writes OUT/peer-<r>.log and peer 0's run folder
# OUT/run; prints what each peer said about NATs and its links, and peer 0's summary.
# PUBLIC=2 adds a second peer on the public side, pub1 10.80.0.2 (peer 3, its run folder
# OUT/peer-3): four peers on a ring 0 - 1 - 2 - 3 - 0, and with both routers symmetric
# the link 1 <-> 2 is relayed through peer 3, not peer 0. KILL=R@E kills peer R (SIGKILL)
# once peer 0 has recorded epoch E: the others must finish without it (its failure is
# expected; with R = 0 a survivor keeps the record in its run folder, OUT/peer-<r>, the
# lowest live peer behind no NAT); each survivor's exit status is printed.
# RATE (e.g. 100mbit) shapes every site's access link, both directions (tc tbf on the
# routers' and peer 0's side of the public bridge): relayed traffic then crosses peer 0's
# link twice, as it would on the internet. Default: unshaped.
# Needs root and iptables; removes its namespaces when it ends, also on failure.
set -euo pipefail
# shellcheck source=experiments/cluster/netns-lib.sh
. "$(dirname "$(realpath "$0")")/netns-lib.sh"
OUT=${1:?usage: netns-nat.sh OUT [murmur peer options…]}
shift
MURMUR=$(realpath "${MURMUR:-target/release/murmur}")
[ "$(id -u)" = 0 ] || { echo "netns-nat.sh: needs root (ip netns, iptables)" >&2; exit 1; }
command -v iptables >/dev/null || { echo "netns-nat.sh: needs iptables (Debian: apt install iptables)" >&2; exit 1; }
mkdir -p "$OUT"
OUT=$(realpath "$OUT")
PUBLIC=${PUBLIC:-1}
case "$PUBLIC" in 1 | 2) ;; *) echo "netns-nat.sh: PUBLIC is 1 or 2" >&2; exit 1 ;; esac
NS=(pub0 nat1 nat2 lan1 lan2)
[ "$PUBLIC" = 2 ] && NS+=(pub1)

cleanup() { netns_remove mrpub "${NS[@]}"; }
trap cleanup EXIT
cleanup

ip link add mrpub type bridge
ip link set mrpub up
# bridged NS VETH DEV IP: namespace NS on the public bridge, its interface DEV at IP/24,
# the veth's other end VETH on the bridge.
bridged() {
    ip netns add "$1"
    ip link add "$2" type veth peer name "$3" netns "$1"
    ip link set "$2" master mrpub up
    ip -n "$1" addr add "$4/24" dev "$3"
    ip -n "$1" link set "$3" up
    ip -n "$1" link set lo up
}
for k in $(seq 0 $((PUBLIC - 1))); do
    bridged "pub$k" "mrp$k" eth0 "10.80.0.$((k + 1))"
done
for k in 1 2; do
    bridged "nat$k" "mrn$k" wan "10.80.0.1$k"
    ip netns add "lan$k"
    ip -n "nat$k" link add lan type veth peer name eth0 netns "lan$k"
    ip -n "nat$k" addr add "192.168.$k.1/24" dev lan
    ip -n "nat$k" link set lan up
    ip -n "lan$k" addr add "192.168.$k.2/24" dev eth0
    ip -n "lan$k" link set eth0 up
    ip -n "lan$k" link set lo up
    ip -n "lan$k" route add default via "192.168.$k.1"
    ip netns exec "nat$k" sysctl -qw net.ipv4.ip_forward=1
    random=()
    case "${SYMMETRIC:-0}" in
        1) random=(--random-fully) ;;
        2) [ "$k" = 2 ] && random=(--random-fully) ;;
    esac
    ip netns exec "nat$k" iptables -t nat -A POSTROUTING -o wan -j MASQUERADE "${random[@]}"
    ip netns exec "nat$k" iptables -A INPUT -i wan -m conntrack --ctstate NEW,INVALID -j DROP
    ip netns exec "nat$k" iptables -A FORWARD -i wan -m conntrack --ctstate NEW,INVALID -j DROP
done

# shape DEV [NETNS]: a token bucket of RATE on DEV's egress.
shape() {
    local ns=()
    [ -n "${2:-}" ] && ns=(-n "$2")
    tc "${ns[@]}" qdisc add dev "$1" root tbf rate "$RATE" burst 64kb latency 100ms
}
if [ -n "${RATE:-}" ]; then
    shape eth0 pub0
    shape mrp0
    for k in 1 2; do
        shape wan "nat$k"
        shape "mrn$k"
    done
fi

common=(--peers $((PUBLIC + 2)) --topology ring "$@")
ip netns exec pub0 "$MURMUR" peer --rank 0 "${common[@]}" \
    --listen /ip4/10.80.0.1/udp/4001/quic-v1 --data-addr 10.80.0.1:5001 \
    --bootstrap-file "$OUT/boot.addr" --out "$OUT/run" >"$OUT/peer-0.log" 2>&1 &
pids=($!)
BOOT=$(bootstrap_address "$OUT")
for k in 1 2; do
    ip netns exec "lan$k" "$MURMUR" peer --rank "$k" "${common[@]}" --bootstrap "$BOOT" \
        --listen /ip4/0.0.0.0/udp/4001/quic-v1 --data-addr 0.0.0.0:5001 \
        --out "$OUT/peer-$k" >"$OUT/peer-$k.log" 2>&1 &
    pids+=($!)
done
if [ "$PUBLIC" = 2 ]; then
    ip netns exec pub1 "$MURMUR" peer --rank 3 "${common[@]}" --bootstrap "$BOOT" \
        --listen /ip4/10.80.0.2/udp/4001/quic-v1 --data-addr 10.80.0.2:5001 \
        --out "$OUT/peer-3" >"$OUT/peer-3.log" 2>&1 &
    pids+=($!)
fi
status=0
if [ -n "${KILL:-}" ]; then
    victim=${KILL%@*}
    epoch=${KILL#*@}
    [ -n "${pids[$victim]:-}" ] || { echo "netns-nat.sh: KILL: no peer $victim" >&2; exit 2; }
    until grep -q "\"epoch\":$epoch," "$OUT/run/epochs.jsonl" 2>/dev/null; do
        kill -0 "${pids[0]}" 2>/dev/null || break
        sleep 0.05
    done
    kill -KILL "${pids[$victim]}" 2>/dev/null || true
    wait "${pids[$victim]}" 2>/dev/null || true
    echo "netns-nat.sh: killed peer $victim once peer 0 had recorded epoch $epoch"
    for r in $(seq 0 $((${#pids[@]} - 1))); do
        [ "$r" = "$victim" ] && continue
        code=0
        wait "${pids[$r]}" || code=$?
        echo "netns-nat.sh: peer $r exited with status $code"
        [ "$code" = 0 ] || status=1
    done
else
    wait_peers "$OUT" "${pids[@]}" || status=1
fi
for r in $(seq 0 $((${#pids[@]} - 1))); do
    sed 's/\x1b\[[0-9;]*m//g' "$OUT/peer-$r.log" |
        grep -E "NAT|links:|RELAYED|relayed path" | sed -E "s/^[^ ]* *(INFO|WARN) /peer $r: /" || true
done
if [ "${victim:-}" = 0 ]; then
    # Peer 0 died: the summary is the stand-in keeper's.
    grep -hE "epochs? in" "$OUT"/peer-*.log | sed 's/\x1b\[[0-9;]*m//g' | tail -1 || true
else
    summary_line "$OUT"
fi
exit $status
