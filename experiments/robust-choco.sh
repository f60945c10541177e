#!/usr/bin/env bash
# Byzantine-robust CHOCO-SGD on MNIST: 16 simulated peers (`murmur simulate`, top-1%, γ 0.1,
# 10 epochs, seed 1) on a 4×4 torus and the exponential graph, with 0, 2 or 3 Byzantine
# peers (ranks 3, 11 / 3, 8, 13; sign flip, noise σ = 1, ALIE z = 1), mixing plainly or
# with `--robust clip:auto:2`. The attackers set their public copy x̂ to the attack
# (murmur_gossip::Byzantine::with_increments).
#
#   experiments/robust-choco.sh [OUT]     # OUT: experiments/results/robust-choco
#
# MURMUR: the binary (target/release/murmur). Runs already in OUT/runs are kept (delete
# them to run again). Writes OUT/robust-choco.csv and prints it as a table.
set -euo pipefail
OUT=${1:-experiments/results/robust-choco}
MURMUR=$(realpath "${MURMUR:-target/release/murmur}")
mkdir -p "$OUT/runs"
OUT=$(realpath "$OUT")
csv="$OUT/robust-choco.csv"
echo "topology,rule,attack,attackers,mean_acc,min_acc,avg_model_acc,consensus_distance" >"$csv"
for topo in torus exponential; do
    for rule in plain clip2; do
        for atk in none:0 signflip:2 signflip:3 noise:2 alie:2; do
            a=${atk%%:*}
            k=${atk##*:}
            id="$topo-$rule-$a-$k"
            args=(--peers=16 --seed=1 --compute-ms=2 --epochs=10 --algorithm=choco "--topology=$topo")
            [ "$rule" = clip2 ] && args+=(--robust=clip:auto:2)
            case $k in
                2) args+=("--byzantine=3:$a" "--byzantine=11:$a") ;;
                3) args+=("--byzantine=3:$a" "--byzantine=8:$a" "--byzantine=13:$a") ;;
            esac
            if [ ! -f "$OUT/runs/$id/summary.json" ]; then
                echo "== $id" >&2
                (cd "$OUT" && "$MURMUR" simulate "${args[@]}" --run-id "$id" >/dev/null)
            fi
            python3 - "$OUT/runs/$id/summary.json" "$topo" "$rule" "$a" "$k" >>"$csv" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
print(",".join(sys.argv[2:6] + [f'{s["final_mean_test_accuracy"]:.4f}',
      f'{s["final_min_test_accuracy"]:.4f}', f'{s["final_avg_model_test_accuracy"]:.4f}',
      f'{s["final_consensus_distance"]:.3e}']))
EOF
        done
    done
done
column -s, -t <"$csv"
