#!/usr/bin/env bash
# The resident memory of each peer process of one `murmur launch`, sampled every 0.5 s
# from /proc: each peer's peak and, over the second half of the run (training, after
# loading), its range.
#
#   experiments/bench/peer_memory.sh --model resnet20 --data DIR --peers 2 --epochs 1 \
#       --rounds-per-epoch 6
#
# The arguments go to `murmur launch` unchanged (`--out` defaults to a temporary folder).
# MURMUR names the binary (default ./target/release/murmur). Linux only.
set -euo pipefail
murmur="${MURMUR:-./target/release/murmur}"
out="$(mktemp -d)"
"$murmur" launch --out "$out" "$@" >"$out/launch.log" 2>&1 &
launch=$!
samples="$out/rss.txt" # one line per sample: seconds, then "pid:KiB" per peer
while kill -0 "$launch" 2>/dev/null; do
    line="$SECONDS"
    for pid in $(pgrep -P "$launch" || true); do
        kib=$(awk '/^VmRSS/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
        [[ -n "$kib" ]] && line="$line $pid:$kib"
    done
    echo "$line" >>"$samples"
    sleep 0.5
done
wait "$launch" || { tail -n 5 "$out/launch.log"; echo "peer_memory.sh: the launch failed ($out)" >&2; exit 1; }
tail -n 1 "$out/launch.log"
python3 - "$samples" <<'PY'
import sys
rows = [line.split() for line in open(sys.argv[1])]
by_pid = {}
for i, row in enumerate(rows):
    for item in row[1:]:
        pid, kib = item.split(":")
        by_pid.setdefault(pid, []).append((i, int(kib) / 1024))
half = len(rows) // 2
for pid, values in sorted(by_pid.items()):
    late = [v for i, v in values if i >= half] or [v for _, v in values]
    print(f"peer process {pid}: peak {max(v for _, v in values):.0f} MiB; "
          f"second half of the run {min(late):.0f}-{max(late):.0f} MiB")
PY
