#!/usr/bin/env bash
# An n-peer ring on n "hosts" of this machine: one network namespace per peer (h0 … hN-1,
# 10.78.0.(i+1)/24 on a bridge), every link shaped with tc (htb, one class per neighbour,
# so that one link can be slower than the others), one `murmur peer` per namespace.
#
#   sudo experiments/cluster/netns-ring.sh OUT [murmur peer options…]
#
# Environment: MURMUR (binary; default target/release/murmur), PEERS (8), FAST (link rate,
# tc units; 200mbit), SLOW (rate of the link SLOW_LINK; default: FAST), SLOW_LINK ("3-4":
# the ring edge between ranks 3 and 4), SLOW_ONEWAY (1: only the direction 3 → 4 of that
# edge is slow, 4 → 3 runs at FAST: an asymmetric link), MTU (every link's MTU in bytes;
# 1500, or 9000 for a jumbo-frame fabric), VANISH ("R@SECS": SECS seconds after
# the peers start, host R vanishes as a host that loses power does: its link goes down, then
# its process is killed, so no FIN or RST reaches the others; the time is written to
# OUT/vanish.txt and peer R's failure is expected), RESTART ("R@E": once peer 0 has
# recorded epoch E, peer R (≥ 1) is killed (SIGKILL) and started again at once with
# `--resume`, as a supervisor would; its new process logs to OUT/peer-R.restart.log, and
# the seconds from its start to its rejoin (its `rejoining: mixing again` line) are
# printed, with its catch-up line), CUT ("A-B@SECS": SECS seconds after the peers start,
# every packet between hosts hA and hB is dropped (iptables, both ways), a partition of
# one ring edge; the time is written to OUT/cut.txt; the ends the run goes on without leave
# with exit status 75, which is printed and not counted as a failure, and the seconds from
# the cut to the last peer's end are printed), BASELINE ("gloo": instead of murmur,
# the same ring as D-PSGD in PyTorch over gloo, experiments/wire/gloo_dpsgd.py run with
# $PYTHON, default python3; the options are that script's, e.g. --hidden 31447; its JSON
# lines are printed; "iperf3": iperf3's server on h1 and its client on h0, the options
# iperf3's, e.g. -P 4 -n 1G; its summary is printed), FLOW_CAP (a rate: each TCP flow
# of a link is held to it as well, as a cloud caps one flow below the link: TCP packets
# are spread over 256 classes of that rate by their source port's low byte, so the
# connections one peer opens land in classes of their own, but for a chance collision;
# other packets share the link's rate). Latency is not shaped (netem is not in
# every kernel); tc's htb queues add what a full link adds.
#
# Writes OUT/peer-<r>.log (every peer's log; the `link` lines of choco-auto say what each
# link measured and sent) and peer 0's run folder OUT/run (summary.json, epochs.csv). Prints
# peer 0's summary line. Needs root (ip netns, tc); removes its namespaces and bridge when
# it ends, also on failure.
set -euo pipefail
# shellcheck source=experiments/cluster/netns-lib.sh
. "$(dirname "$(realpath "$0")")/netns-lib.sh"

OUT=${1:?usage: netns-ring.sh OUT [murmur peer options…]}
shift
MURMUR=$(realpath "${MURMUR:-target/release/murmur}")
PEERS=${PEERS:-8}
FAST=${FAST:-200mbit}
SLOW=${SLOW:-$FAST}
SLOW_LINK=${SLOW_LINK:-3-4}
MTU=${MTU:-1500}
BR=mrbr0
NET=10.78.0

[ "$(id -u)" = 0 ] || { echo "netns-ring.sh: needs root (ip netns, tc)" >&2; exit 1; }
[ -x "$MURMUR" ] || { echo "netns-ring.sh: no murmur binary at $MURMUR (cargo build --release)" >&2; exit 1; }
mkdir -p "$OUT"
OUT=$(realpath "$OUT")
# What an earlier run into OUT left (its record would look like this run's progress).
rm -rf "$OUT/run" "$OUT"/peer-* "$OUT/boot.addr" "$OUT/vanish.txt"

cleanup() {
    local hosts=()
    for i in $(seq 0 $((PEERS - 1))); do hosts+=("h$i"); done
    netns_remove "$BR" "${hosts[@]}"
}
trap cleanup EXIT
cleanup

ip link add "$BR" type bridge
ip link set "$BR" up
for i in $(seq 0 $((PEERS - 1))); do
    ip netns add "h$i"
    # A namespace deleted a moment ago can leave its veth behind for a while (the kernel
    # frees it later).
    ip link del "mrv$i" 2>/dev/null || true
    ip link add "mrv$i" type veth peer name eth0 netns "h$i"
    ip link set "mrv$i" mtu "$MTU" master "$BR" up
    ip -n "h$i" addr add "$NET.$((i + 1))/24" dev eth0
    ip -n "h$i" link set eth0 mtu "$MTU" up
    ip -n "h$i" link set lo up
done

# Under the link class $2 of host $1 (to neighbour $3, rate $4): 256 classes of FLOW_CAP
# each (minors 0x1000 + 257·j + bucket), TCP packets hashed into them by the low byte of
# their source port (the IP header taken as 20 bytes, as Linux sends it; the low 4 bits
# alone put 4 connections of one process into 2 classes: their ports step by 2 or 16),
# and one class of the link's rate for every other packet. htb goes on classifying with
# an inner class's own filters; those get a root hash table of their own (no `ht 800::`,
# which is the qdisc's). One `tc -batch` (512 commands).
flow_cap() {
    local ns=$1 parent=$2 j=$3 rate=$4 b base=$((4096 + 257 * $3))
    {
        for b in $(seq 0 256); do
            local r=$FLOW_CAP
            [ "$b" = 256 ] && r=$rate
            echo "class add dev eth0 parent $parent classid 1:$(printf %x $((base + b))) htb rate $r ceil $r"
        done
        echo "filter add dev eth0 parent $parent prio 1 handle $(printf %x $((j + 2))): protocol ip u32 divisor 256"
        echo "filter add dev eth0 parent $parent prio 1 protocol ip u32 match ip protocol 6 0xff hashkey mask 0x00ff0000 at 20 link $(printf %x $((j + 2))):"
        for b in $(seq 0 255); do
            echo "filter add dev eth0 parent $parent prio 1 protocol ip u32 ht $(printf %x $((j + 2))):$(printf %x "$b"): match u32 0 0 flowid 1:$(printf %x $((base + b)))"
        done
        echo "filter add dev eth0 parent $parent prio 2 protocol ip u32 match u32 0 0 flowid 1:$(printf %x $((base + 256)))"
    } | tc -n "$ns" -batch -
}

# Egress of host i: one htb class per ring neighbour j (rate FAST, or SLOW on the slow
# edge), chosen by destination address; everything else (the bootstrap's control traffic
# to non-neighbours) unshaped.
slow_a=${SLOW_LINK%-*}
slow_b=${SLOW_LINK#*-}
for i in $(seq 0 $((PEERS - 1))); do
    tc -n "h$i" qdisc add dev eth0 root handle 1: htb default 1 r2q 1000
    tc -n "h$i" class add dev eth0 parent 1: classid 1:1 htb rate 10gbit
    # With 2 peers both neighbours are the same peer: one class.
    for j in $(printf '%s\n' $(((i + 1) % PEERS)) $(((i + PEERS - 1) % PEERS)) | sort -u); do
        rate=$FAST
        if { [ "$i" = "$slow_a" ] && [ "$j" = "$slow_b" ]; } ||
            { [ "${SLOW_ONEWAY:-0}" != 1 ] && [ "$i" = "$slow_b" ] && [ "$j" = "$slow_a" ]; }; then
            rate=$SLOW
        fi
        tc -n "h$i" class add dev eth0 parent 1: classid "1:$((j + 10))" htb rate "$rate" ceil "$rate"
        tc -n "h$i" filter add dev eth0 parent 1: protocol ip prio 1 u32 \
            match ip dst "$NET.$((j + 1))/32" flowid "1:$((j + 10))"
        if [ -n "${FLOW_CAP:-}" ]; then flow_cap "h$i" "1:$((j + 10))" "$j" "$rate"; fi
    done
done

if [ "${BASELINE:-}" = iperf3 ]; then
    ip netns exec h1 iperf3 -s -1 -B "$NET.2" >"$OUT/iperf3-server.log" 2>&1 &
    server=$!
    sleep 0.5
    status=0
    ip netns exec h0 iperf3 -c "$NET.2" -B "$NET.1" "$@" >"$OUT/iperf3.log" 2>&1 || status=1
    wait "$server" || true
    grep -E 'sender|receiver' "$OUT/iperf3.log" | tail -2 || cat "$OUT/iperf3.log"
    exit $status
fi

if [ "${BASELINE:-}" = gloo ]; then
    script="$(dirname "$(realpath "$0")")/../wire/gloo_dpsgd.py"
    pids=()
    for i in $(seq 0 $((PEERS - 1))); do
        GLOO_SOCKET_IFNAME=eth0 ip netns exec "h$i" "${PYTHON:-python3}" "$script" --rank "$i" \
            --peers "$PEERS" --master-addr "$NET.1" "$@" >"$OUT/peer-$i.log" 2>&1 &
        pids+=($!)
    done
    status=0
    wait_peers "$OUT" "${pids[@]}" || status=1
    grep -h '^{' "$OUT"/peer-*.log || true
    exit $status
fi

common=(--peers "$PEERS" --topology ring "$@")
ip netns exec h0 "$MURMUR" peer --rank 0 "${common[@]}" \
    --listen "/ip4/$NET.1/udp/4001/quic-v1" --data-addr "$NET.1:5001" \
    --bootstrap-file "$OUT/boot.addr" --out "$OUT/run" >"$OUT/peer-0.log" 2>&1 &
pids=($!)
BOOT=$(bootstrap_address "$OUT")
for i in $(seq 1 $((PEERS - 1))); do
    ip netns exec "h$i" "$MURMUR" peer --rank "$i" "${common[@]}" --bootstrap "$BOOT" \
        --listen "/ip4/$NET.$((i + 1))/udp/4001/quic-v1" --data-addr "$NET.$((i + 1)):5001" \
        --out "$OUT/peer-$i" >"$OUT/peer-$i.log" 2>&1 &
    pids+=($!)
done
status=0
if [ -n "${VANISH:-}" ]; then
    gone=${VANISH%@*}
    sleep "${VANISH#*@}"
    ip link set "mrv$gone" down
    date +%s.%N >"$OUT/vanish.txt"
    kill -9 "${pids[$gone]}"
    wait "${pids[$gone]}" || true
    echo "host h$gone vanished at $(cat "$OUT/vanish.txt")"
    pids[$gone]=""
fi
if [ -n "${RESTART:-}" ]; then
    victim=${RESTART%@*}
    epoch=${RESTART#*@}
    [ "$victim" -ge 1 ] || { echo "netns-ring.sh: RESTART needs a rank of at least 1" >&2; exit 2; }
    until grep -q "\"epoch\":$epoch," "$OUT/run/epochs.jsonl" 2>/dev/null; do sleep 0.05; done
    kill -9 "${pids[$victim]}"
    wait "${pids[$victim]}" || true
    i=$victim
    ip netns exec "h$i" "$MURMUR" peer --rank "$i" "${common[@]}" --bootstrap "$BOOT" \
        --listen "/ip4/$NET.$((i + 1))/udp/4001/quic-v1" --data-addr "$NET.$((i + 1)):5001" \
        --out "$OUT/peer-$i" --resume >"$OUT/peer-$i.restart.log" 2>&1 &
    pids[$victim]=$!
    restarted=$(date +%s.%N)
fi
if [ -n "${CUT:-}" ]; then
    command -v iptables >/dev/null || { echo "netns-ring.sh: CUT needs iptables" >&2; exit 2; }
    ends=${CUT%@*}
    a=${ends%-*} b=${ends#*-}
    sleep "${CUT#*@}"
    ip netns exec "h$a" iptables -A INPUT -s "$NET.$((b + 1))" -j DROP
    ip netns exec "h$b" iptables -A INPUT -s "$NET.$((a + 1))" -j DROP
    date +%s.%N >"$OUT/cut.txt"
    echo "the link between h$a and h$b cut at $(cat "$OUT/cut.txt")"
    for r in "$a" "$b"; do
        code=0
        wait "${pids[$r]}" || code=$?
        echo "peer $r (an end of the cut) exited with status $code"
        [ "$code" = 0 ] || [ "$code" = 75 ] || status=1
        pids[$r]=""
    done
fi
wait_peers "$OUT" "${pids[@]}" || status=1
if [ -n "${CUT:-}" ]; then
    echo "every peer ended $(echo "$(date +%s.%N) - $(cat "$OUT/cut.txt")" | bc) s after the cut"
fi
if [ -n "${RESTART:-}" ]; then
    log=$OUT/peer-$victim.restart.log
    rejoined=$(grep -m1 'rejoining: mixing again' "$log" | cut -d' ' -f1 || true)
    if [ -n "$rejoined" ]; then
        echo "peer $victim rejoined $(echo "$(date -d "$rejoined" +%s.%N) - $restarted" | bc) s after its restart"
    else
        echo "peer $victim did not rejoin; see $log"
    fi
    grep -h 'caught up' "$log" | sed 's/\x1b\[[0-9;]*m//g' || true
fi
summary_line "$OUT"
exit $status
