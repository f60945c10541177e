#!/usr/bin/env bash
# Per-link choices on shaped links: an 8-peer ring (one network namespace per peer,
# netns-ring.sh) where every link runs at FAST except one at SLOW (10× slower by default):
# CHOCO-SGD with one compressor on every link against choco-auto (a compressor per link
# from its measured bandwidth), and local-SGD gossip (H = 4) against local-auto (a period
# per link). CONFIGS=local runs only the latter.
#
#   sudo experiments/cluster/per-link.sh [OUT]        # OUT: experiments/results/per-link
#
# Environment: MURMUR, FAST (200mbit), SLOW (20mbit), EPOCHS (20), SEEDS ("1"), CONFIGS (an
# extended regular expression: run only the configs whose name matches; default all). Runs
# already in OUT/runs are kept (delete them to run again) and go into the CSV. Writes
# OUT/runs/<config>-s<seed>/ (every peer's log, peer 0's run folder), OUT/per-link.csv
# (config, seed, links, algorithm, compressor, seconds per round, final mean / min test
# accuracy, MB sent per peer, what link 3 → 4 sent) and, for choco-auto,
# OUT/links-<config>-s<seed>.log: every peer's last `link` lines (what each link measured
# and sent over the run).
set -euo pipefail
here=$(dirname "$(realpath "$0")")
OUT=${1:-experiments/results/per-link}
FAST=${FAST:-200mbit}
SLOW=${SLOW:-20mbit}
EPOCHS=${EPOCHS:-20}
SEEDS=${SEEDS:-1}
mkdir -p "$OUT/runs"
csv="$OUT/per-link.csv"
echo "config,seed,links,algorithm,compressor,seconds_per_round,mean_acc,min_acc,mb_sent_per_peer,slow_link_3to4" >"$csv"

# name | slow-link rate | murmur options
configs=(
    "all-fast choco-auto|$FAST|--algorithm choco-auto"
    "slow choco identity|$SLOW|--algorithm choco --compressor identity --gamma 0.1"
    "slow choco topk:0.05|$SLOW|--algorithm choco --compressor topk:0.05 --gamma 0.1"
    "slow choco-auto|$SLOW|--algorithm choco-auto"
    "all-fast local-sgd|$FAST|--algorithm local-sgd"
    "all-fast local-auto|$FAST|--algorithm local-auto"
    "slow local-sgd|$SLOW|--algorithm local-sgd"
    "slow local-auto|$SLOW|--algorithm local-auto"
)
for seed in $SEEDS; do
    for c in "${configs[@]}"; do
        IFS='|' read -r name slow opts <<<"$c"
        dir="$OUT/runs/${name// /-}-s$seed"
        if [ ! -f "$dir/run/summary.json" ]; then
            [[ $name =~ ${CONFIGS:-.} ]] || continue
            rm -rf "$dir"
            echo "== $name (slow link $slow, seed $seed)" >&2
            # shellcheck disable=SC2086
            FAST=$FAST SLOW=$slow "$here/netns-ring.sh" "$dir" $opts --epochs "$EPOCHS" --seed "$seed" \
                2> >(grep -v "quantum of class" >&2)
        fi
        links="fast=$FAST slow(3-4)=$slow"
        sent=$(grep -h " link to=4 " "$dir/peer-3.log" 2>/dev/null | tail -1 | sed 's/\x1b\[[0-9;]*m//g; s/.*bandwidth=//' || true)
        if [ -n "$sent" ]; then
            for i in $(seq 0 7); do
                grep -h " link " "$dir/peer-$i.log" | sed 's/\x1b\[[0-9;]*m//g; s/.*murmur::peer::run: //' |
                    tail -2 | sed "s/^/peer $i: /"
            done >"$OUT/links-${name// /-}-s$seed.log"
        fi
        python3 - "$dir/run/summary.json" "$name" "$seed" "$links" "$sent" >>"$csv" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
name, seed, links, sent = sys.argv[2:6]
print(",".join([name, seed, links, s["algorithm"], s["compressor"],
                f'{s["seconds_per_round"]:.4f}', f'{s["final_mean_test_accuracy"]:.4f}',
                f'{s["final_min_test_accuracy"]:.4f}', f'{s["bytes_sent_per_peer"] / 1e6:.1f}',
                '"' + sent + '"']))
EOF
    done
done
column -s, -t <"$csv"
