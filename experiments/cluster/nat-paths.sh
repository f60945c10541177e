#!/usr/bin/env bash
# What the relayed fallback costs: the 3-peer run of netns-nat.sh (peer 0 public, peers 1
# and 2 each behind its own NAT), every site's access link shaped to RATE, with
#   direct        both NATs port-preserving: every link direct (hole-punched);
#   one-symmetric router 2 a symmetric NAT: 0 -> 1 direct, 0 -> 2, 1 <-> 2 relayed;
#   relayed       both symmetric: every link to or between peers 1 and 2 relayed (only
#                 1 -> 0 and 2 -> 0 direct).
#
#   sudo experiments/cluster/nat-paths.sh [OUT]        # OUT: experiments/results/nat-paths
#
# Environment: MURMUR, RATE (100mbit), EPOCHS (1), SEEDS ("1 2 3"). Runs already in
# OUT/runs are kept (delete them to run again). Writes OUT/runs/<config>-s<seed>/ (every
# peer's log, peer 0's run folder), OUT/paths-<config>-s<seed>.log (what each peer said
# about NATs and the path of each link) and OUT/nat-paths.csv (config, seed, relayed
# links, seconds per round, wall seconds, final mean accuracy).
set -euo pipefail
here=$(dirname "$(realpath "$0")")
OUT=${1:-experiments/results/nat-paths}
RATE=${RATE:-100mbit}
EPOCHS=${EPOCHS:-1}
SEEDS=${SEEDS:-1 2 3}
mkdir -p "$OUT/runs"
csv="$OUT/nat-paths.csv"
echo "config,seed,rate,relayed_links,seconds_per_round,wall_seconds,mean_acc" >"$csv"
for seed in $SEEDS; do
    for c in "direct|0" "one-symmetric|2" "relayed|1"; do
        IFS='|' read -r name symmetric <<<"$c"
        dir="$OUT/runs/$name-s$seed"
        if [ ! -f "$dir/run/summary.json" ]; then
            rm -rf "$dir"
            echo "== $name (access links $RATE, seed $seed)" >&2
            RATE=$RATE SYMMETRIC=$symmetric "$here/netns-nat.sh" "$dir" --epochs "$EPOCHS" \
                --seed "$seed" >/dev/null
        fi
        relayed=$(cat "$dir"/peer-*.log | sed 's/\x1b\[[0-9;]*m//g' | grep -c "RELAYED through peer" || true)
        for r in 0 1 2; do
            sed 's/\x1b\[[0-9;]*m//g' "$dir/peer-$r.log" | grep -E "NAT|links:|RELAYED|relayed path" |
                sed -E "s/^[^ ]* *(INFO|WARN) [^:]*: [^ ]* /peer $r: /" || true
        done >"$OUT/paths-$name-s$seed.log"
        python3 - "$dir/run/summary.json" "$name" "$seed" "$RATE" "$relayed" >>"$csv" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
name, seed, rate, relayed = sys.argv[2:6]
print(",".join([name, seed, rate, relayed, f'{s["seconds_per_round"]:.4f}',
                f'{s["wall_seconds"]:.1f}', f'{s["final_mean_test_accuracy"]:.4f}']))
EOF
    done
done
cat "$csv"
