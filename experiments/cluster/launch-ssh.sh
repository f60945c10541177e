#!/usr/bin/env bash
# Starts one `murmur peer` per line of a host file over ssh: a run across hosts without a
# scheduler. Rank r runs on the host of line r + 1; peer 0 (the first line) is the bootstrap.
#
#   experiments/cluster/launch-ssh.sh HOSTFILE RUN_DIR [run options…]
#
# HOSTFILE: one peer per line, `HOST [ADDRESS]` — HOST is what ssh connects to, ADDRESS the
# IPv4 address the other peers reach it on. Without ADDRESS: HOST if it is an IPv4 address,
# else the host's first IPv4 address of global scope, asked over ssh (`ip -o -4 addr show
# scope global`; of interface MURMUR_IFACE if set) — never its host name, which
# Debian/Ubuntu map to 127.0.1.1. Blank lines and lines starting with # are skipped. A host
# may appear on several lines (several peers on one host).
# RUN_DIR: the run folder on every host (the same path on each; no shared filesystem
# needed). Each peer writes its files there and its libp2p multiaddr to
# RUN_DIR/addrs/peer-<r>.addr (a peer added later with --join-running may enter the run
# through any of them); peer 0 also bootstrap.addr, and the record's keeper (peer 0, or the
# lowest live peer while peer 0 is away or once it has failed for good) the epochs, the
# summary and the membership. Back on this machine, in RUN_DIR: every peer's log
# (logs/peer-<r>.log) and, from the keeper's host (peer 0's; the lowest rank that finished
# if peer 0 failed), summary.json, summary.csv, epochs.csv, epochs.jsonl, membership.jsonl
# and distances.jsonl (those that exist), and the charts, plots/ (drawn there with `murmur
# plot`); the keeper's table and summary line are printed. Without a shared filesystem a
# stand-in's record covers only the epochs from its taking over (its own folder).
# Run options: passed to every peer (e.g. --epochs 20 --topology ring --checkpoint-every 50);
# --peers is set from the host file.
#
# Environment: MURMUR (the binary on the hosts; default `murmur` on their PATH), SSH (the
# ssh command; default `ssh -o BatchMode=yes`), LIBP2P_PORT and DATA_PORT (default 4001 and
# 5001): the l-th peer on an address (l = 0, 1, …) listens for libp2p on UDP LIBP2P_PORT + l
# and for the data plane on UDP DATA_PORT + l; 0: any free port. Open those UDP ports
# between the hosts. MURMUR_IFACE: see ADDRESS.
#
# Exit status: 0 if every peer finished, else 1 (the failed peers' logs are named).
# Ctrl-C, or SIGTERM to this script, stops every peer: each peer's ssh session holds its
# standard input open, and a peer whose session ends (its ssh client stopped or killed, the
# connection lost) is sent SIGTERM on its host.
set -euo pipefail

if [[ $# -lt 2 ]]; then
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
    exit 2
fi
hostfile=$1
run_dir=$2
shift 2
MURMUR=${MURMUR:-murmur}
read -r -a ssh_cmd <<< "${SSH:-ssh -o BatchMode=yes}"
LIBP2P_PORT=${LIBP2P_PORT:-4001}
DATA_PORT=${DATA_PORT:-5001}

quote() { printf '%q ' "$@"; }
on() { # on HOST COMMAND: runs COMMAND (one shell string) on HOST
    "${ssh_cmd[@]}" "$1" "$2" < /dev/null
}
spawn_on() { # spawn_on HOST COMMAND &: this background job becomes the ssh client (its pid is $!)
    exec "${ssh_cmd[@]}" "$1" "$2" <&"$session_in"
}
is_ipv4() { [[ $1 =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ ]]; }

hosts=()
addrs=()
while read -r host addr _; do
    [[ -z "${host:-}" || "$host" == \#* ]] && continue
    if [[ -z ${addr:-} ]]; then
        if is_ipv4 "$host"; then
            addr=$host
        else
            if [[ -n ${MURMUR_IFACE:-} ]]; then
                which="dev $(quote "$MURMUR_IFACE")"
            else
                which="scope global"
            fi
            addr=$(on "$host" "ip -o -4 addr show $which" | awk '{ sub("/.*", "", $4); print $4; exit }') || true
            if [[ -z $addr ]]; then
                echo "launch-ssh: no IPv4 address found on $host (ip -o -4 addr show $which); give it as the second field of its line" >&2
                exit 2
            fi
        fi
    fi
    hosts+=("$host")
    addrs+=("$addr")
done < "$hostfile"
n=${#hosts[@]}
if [[ $n -eq 0 ]]; then
    echo "launch-ssh: $hostfile lists no host" >&2
    exit 2
fi
for a in "${addrs[@]}"; do
    if ! is_ipv4 "$a"; then
        echo "launch-ssh: '$a' is not an IPv4 address; give it as the second field of its line" >&2
        exit 2
    fi
done
mkdir -p "$run_dir/logs"

# Ports: the l-th peer on an address gets base + l.
declare -A seen=()
data_ports=()
p2p_ports=()
for ((r = 0; r < n; r++)); do
    l=${seen[${addrs[$r]}]:-0}
    seen[${addrs[$r]}]=$((l + 1))
    data_ports+=($((DATA_PORT == 0 ? 0 : DATA_PORT + l)))
    p2p_ports+=($((LIBP2P_PORT == 0 ? 0 : LIBP2P_PORT + l)))
done

pids=()
stop() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
}
trap 'stop; exit 130' INT TERM
# A pipe that stays open (nothing is written to it) while this script runs: the standard
# input of the peers' ssh sessions, so that their remote side sees end-of-file only when the
# session ends.
exec {session_in}< <(exec sleep 2147483647)
keeper=$!
trap 'kill "$keeper" 2>/dev/null || true' EXIT

# Peer r's command line (one shell string for ssh); the rest are options of its own. The
# peer runs in the background; a watcher reads the session's standard input and sends the
# peer SIGTERM when it ends (the session is gone); the shell exits with the peer's status.
peer_command() {
    local r=$1
    shift
    local peer
    peer=$(quote "$MURMUR" peer --rank "$r" --peers "$n" \
        --listen "/ip4/${addrs[$r]}/udp/${p2p_ports[$r]}/quic-v1" --address-file "$run_dir/addrs/peer-$r.addr" \
        --data-addr "${addrs[$r]}:${data_ports[$r]}" --out "$run_dir" "$@")
    echo "mkdir -p $(quote "$run_dir/addrs") || exit 1; $peer < /dev/null & p=\$!; \
        { cat > /dev/null; kill -TERM \$p 2> /dev/null; } <&0 & w=\$!; \
        wait \$p; s=\$?; kill \$w 2> /dev/null; exit \$s"
}

# Peer 0: the bootstrap. It writes its multiaddr (with its PeerId) to RUN_DIR/bootstrap.addr
# on its host; this script reads it from there.
boot_file="$run_dir/bootstrap.addr"
on "${hosts[0]}" "rm -f $(quote "$boot_file")"
spawn_on "${hosts[0]}" "$(peer_command 0 --bootstrap-file "$boot_file" "$@")" > "$run_dir/logs/peer-0.log" 2>&1 &
pids+=($!)
boot=""
for _ in $(seq 1 600); do
    boot=$(on "${hosts[0]}" "cat $(quote "$boot_file") 2>/dev/null" || true)
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
    spawn_on "${hosts[$r]}" "$(peer_command "$r" --bootstrap "$boot" "$@")" > "$run_dir/logs/peer-$r.log" 2>&1 &
    pids+=($!)
done

failed=()
for ((r = 0; r < n; r++)); do
    if ! wait "${pids[$r]}"; then
        failed+=("$r")
    fi
done

# The record's keeper at the end: peer 0, or, if it failed, the lowest rank that finished
# (it stood in for peer 0 and kept the record).
record_rank=0
if [[ " ${failed[*]} " == *" 0 "* ]]; then
    for ((r = 1; r < n; r++)); do
        if [[ " ${failed[*]} " != *" $r "* ]]; then
            record_rank=$r
            break
        fi
    done
    echo "launch-ssh: peer 0 failed; the record's keeper was peer $record_rank, on ${hosts[$record_rank]}" >&2
fi
record_host=${hosts[$record_rank]}

# The keeper's results, from its host into the local run folder (through a temporary file:
# the two folders may be one, on one machine or a shared filesystem).
fetched=()
for f in summary.json summary.csv epochs.csv epochs.jsonl membership.jsonl distances.jsonl; do
    if on "$record_host" "cat $(quote "$run_dir/$f") 2>/dev/null" > "$run_dir/$f.fetch"; then
        mv "$run_dir/$f.fetch" "$run_dir/$f"
        fetched+=("$f")
    else
        rm -f "$run_dir/$f.fetch"
    fi
done
# The run's charts (plots/, as `launch` draws them), drawn on the keeper's host (where
# MURMUR is) and brought here the same way: a tar stream into a temporary folder, then moved in
# place. A missing font or a run with no epoch recorded is said, not fatal.
if [[ ${#fetched[@]} -gt 0 ]]; then
    plot_log=$(mktemp)
    plots_tmp=$(mktemp -d "$run_dir/.plots.XXXXXX")
    if on "$record_host" "$(quote "$MURMUR" plot "$run_dir")" > "$plot_log" 2>&1 \
        && on "$record_host" "tar -C $(quote "$run_dir") -cf - plots" | tar -C "$plots_tmp" -xf - \
        && [[ -d $plots_tmp/plots ]]; then
        rm -rf "$run_dir/plots"
        mv "$plots_tmp/plots" "$run_dir/plots"
        fetched+=("plots/")
    else
        cat "$plot_log" >&2
        echo "launch-ssh: no plots (see above); \`murmur plot $run_dir\` draws them later" >&2
    fi
    rm -rf "$plots_tmp" "$plot_log"
fi
# The table and summary line: peer 0's, then a stand-in's rows and summary.
grep -v '^[0-9TZ:.-]* *\(INFO\|WARN\|DEBUG\)' "$run_dir/logs/peer-0.log" || true
if [[ $record_rank != 0 ]]; then
    grep -v '^[0-9TZ:.-]* *\(INFO\|WARN\|DEBUG\|ERROR\)' "$run_dir/logs/peer-$record_rank.log" || true
fi
if [[ ${#fetched[@]} -gt 0 ]]; then
    echo "launch-ssh: from $record_host into $run_dir: ${fetched[*]}" >&2
fi

if [[ ${#failed[@]} -gt 0 ]]; then
    for r in "${failed[@]}"; do
        echo "launch-ssh: peer $r failed; end of $run_dir/logs/peer-$r.log:" >&2
        tail -n 5 "$run_dir/logs/peer-$r.log" >&2
    done
    exit 1
fi
echo "launch-ssh: all $n peers finished; run folder $run_dir (here and on ${hosts[0]})" >&2
