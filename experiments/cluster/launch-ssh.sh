#!/usr/bin/env bash
# Starts one `murmur peer` per line of a host file over ssh: a run across hosts without a
# scheduler. Rank r runs on the host of line r + 1; peer 0 (the first line) is the bootstrap.
#
#   experiments/cluster/launch-ssh.sh HOSTFILE RUN_DIR [run options…]
#
# HOSTFILE: one peer per line, `HOST [ADDRESS]` — HOST is what ssh connects to, ADDRESS the
# IP address the other peers reach it on (default: HOST, which must then be an IPv4
# address). Blank lines and lines starting with # are skipped. A host may appear on
# several lines (several peers on one host).
# RUN_DIR: the run folder on every host (each peer writes its own files there; peer 0 also
# the epochs, summary and membership files). The same path on every host; a shared
# filesystem is not needed. Each peer's log comes back to RUN_DIR/logs/peer-<rank>.log
# on this machine.
# Run options: passed to every peer (e.g. --epochs 20 --topology ring --checkpoint-every 50);
# --peers is set from the host file.
#
# Environment: MURMUR (the binary on the hosts; default `murmur` on their PATH), SSH (the
# ssh command; default `ssh -o BatchMode=yes`), LIBP2P_PORT (peer r's libp2p UDP port is
# LIBP2P_PORT + r, default 4001; every peer writes its multiaddr to RUN_DIR/addrs/peer-<r>.addr
# on its host, so a peer added later with --join-running may enter through any of them), DATA_PORT (first data-plane UDP port; peer r uses DATA_PORT + r; default
# 5001; 0: any free port). Open those UDP ports between the hosts.
#
# Exit status: 0 if every peer finished, else 1 (the failed peers' logs are named).
# Ctrl-C stops every peer.
set -euo pipefail

if [[ $# -lt 2 ]]; then
    sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
hostfile=$1
run_dir=$2
shift 2
MURMUR=${MURMUR:-murmur}
read -r -a ssh_cmd <<< "${SSH:-ssh -o BatchMode=yes}"
LIBP2P_PORT=${LIBP2P_PORT:-4001}
DATA_PORT=${DATA_PORT:-5001}

hosts=()
addrs=()
while read -r host addr _; do
    [[ -z "${host:-}" || "$host" == \#* ]] && continue
    hosts+=("$host")
    addrs+=("${addr:-$host}")
done < "$hostfile"
n=${#hosts[@]}
if [[ $n -eq 0 ]]; then
    echo "launch-ssh: $hostfile lists no host" >&2
    exit 2
fi
for a in "${addrs[@]}"; do
    if ! [[ "$a" =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
        echo "launch-ssh: '$a' is not an IPv4 address; give it as the second field of its line" >&2
        exit 2
    fi
done
mkdir -p "$run_dir/logs"

quote() { printf '%q ' "$@"; }
data_port() { if [[ $DATA_PORT -eq 0 ]]; then echo 0; else echo $((DATA_PORT + $1)); fi; }
p2p_port() { if [[ $LIBP2P_PORT -eq 0 ]]; then echo 0; else echo $((LIBP2P_PORT + $1)); fi; }

pids=()
stop() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
}
trap 'stop; exit 130' INT TERM

# Peer 0: the bootstrap. It writes its multiaddr (with its PeerId) to RUN_DIR/bootstrap.addr
# on its host; this script reads it from there.
boot_file="$run_dir/bootstrap.addr"
"${ssh_cmd[@]}" "${hosts[0]}" "rm -f $(quote "$boot_file")" < /dev/null
"${ssh_cmd[@]}" "${hosts[0]}" "mkdir -p $(quote "$run_dir") && exec $(quote "$MURMUR" peer --rank 0 --peers "$n" \
    --listen "/ip4/${addrs[0]}/udp/$LIBP2P_PORT/quic-v1" --bootstrap-file "$boot_file" \
    --data-addr "${addrs[0]}:$(data_port 0)" --out "$run_dir" "$@")" \
    < /dev/null > "$run_dir/logs/peer-0.log" 2>&1 &
pids+=($!)
boot=""
for _ in $(seq 1 600); do
    boot=$("${ssh_cmd[@]}" "${hosts[0]}" "cat $(quote "$boot_file") 2>/dev/null" < /dev/null || true)
    [[ -n "$boot" ]] && break
    if ! kill -0 "${pids[0]}" 2>/dev/null; then
        echo "launch-ssh: peer 0 exited before listening; its log:" >&2
        tail -n 20 "$run_dir/logs/peer-0.log" >&2
        exit 1
    fi
    sleep 0.1
done
if [[ -z "$boot" ]]; then
    echo "launch-ssh: peer 0 published no address within 60 s" >&2
    stop
    exit 1
fi
echo "launch-ssh: $n peers; bootstrap $boot" >&2

for ((r = 1; r < n; r++)); do
    "${ssh_cmd[@]}" "${hosts[$r]}" "mkdir -p $(quote "$run_dir/addrs") && exec $(quote "$MURMUR" peer --rank "$r" --peers "$n" \
        --bootstrap "$boot" --data-addr "${addrs[$r]}:$(data_port "$r")" --out "$run_dir" \
        --listen "/ip4/${addrs[$r]}/udp/$(p2p_port "$r")/quic-v1" --address-file "$run_dir/addrs/peer-$r.addr" "$@")" \
        < /dev/null > "$run_dir/logs/peer-$r.log" 2>&1 &
    pids+=($!)
done

failed=()
for ((r = 0; r < n; r++)); do
    if ! wait "${pids[$r]}"; then
        failed+=("$r")
    fi
done
if [[ ${#failed[@]} -gt 0 ]]; then
    for r in "${failed[@]}"; do
        echo "launch-ssh: peer $r failed; end of $run_dir/logs/peer-$r.log:" >&2
        tail -n 5 "$run_dir/logs/peer-$r.log" >&2
    done
    exit 1
fi
# Peer 0's table and summary.
grep -v '^[0-9TZ:.-]* *\(INFO\|WARN\|DEBUG\)' "$run_dir/logs/peer-0.log" || true
echo "launch-ssh: all $n peers finished; run folder $run_dir on ${hosts[0]}" >&2
