#!/usr/bin/env bash
# Per-link compression in the simulator, where compression costs accuracy: 16 peers on a
# 4×4 torus, non-IID MNIST shards (Dirichlet α = 0.1), NICs at 1 Gb/s, 2 ms compute a step,
# 10 epochs; three torus links (0-1, 5-9, 10-14) 10× slower than the NICs (--slow-link).
# CHOCO-SGD with one compressor on every link (identity: γ 0.5; top-5%: γ 0.1) against
# choco-auto (a compressor and a step per link), and choco-auto without slow links; and
# local-SGD gossip (H = 4) with and without the slow links against local-auto (a period per
# link) with them.
#
#   experiments/per-link-sim.sh [OUT]      # OUT: experiments/results/per-link-sim
#
# MURMUR: the binary (target/release/murmur); SEEDS ("1 2 3"). Runs already in OUT/runs are
# kept. Writes OUT/per-link-sim.csv and prints it as a table.
set -euo pipefail
OUT=${1:-experiments/results/per-link-sim}
MURMUR=$(realpath "${MURMUR:-target/release/murmur}")
mkdir -p "$OUT/runs"
OUT=$(realpath "$OUT")
csv="$OUT/per-link-sim.csv"
slow=(--slow-link 0-1:10 --slow-link 5-9:10 --slow-link 10-14:10)
echo "config,seed,algorithm,compressor,simulated_seconds,mean_acc,min_acc,avg_model_acc,consensus_distance,mb_sent_per_peer" >"$csv"
for seed in ${SEEDS:-1 2 3}; do
    for config in all-fast-choco-auto slow-choco-auto slow-choco-identity slow-choco-topk5 \
        all-fast-local-sgd slow-local-sgd slow-local-auto; do
        case $config in
            all-fast-choco-auto) args=(--algorithm choco-auto) ;;
            slow-choco-auto) args=(--algorithm choco-auto "${slow[@]}") ;;
            slow-choco-identity) args=(--algorithm choco --compressor identity "${slow[@]}") ;;
            slow-choco-topk5) args=(--algorithm choco --compressor topk:0.05 "${slow[@]}") ;;
            all-fast-local-sgd) args=(--algorithm local-sgd) ;;
            slow-local-sgd) args=(--algorithm local-sgd "${slow[@]}") ;;
            slow-local-auto) args=(--algorithm local-auto "${slow[@]}") ;;
        esac
        id="$config-s$seed"
        if [ ! -f "$OUT/runs/$id/summary.json" ]; then
            echo "== $id" >&2
            "$MURMUR" simulate --peers 16 --topology torus --epochs 10 --compute-ms 2 \
                --bandwidth-gbps 1 --partition dirichlet:0.1 --seed "$seed" "${args[@]}" \
                --out "$OUT/runs" --run-id "$id" >/dev/null
        fi
        python3 - "$OUT/runs/$id/summary.json" "$config" "$seed" >>"$csv" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(",".join(sys.argv[2:4] + [s["algorithm"], '"' + s["compressor"] + '"',
      f'{s["wall_seconds"]:.3f}', f'{s["final_mean_test_accuracy"]:.4f}',
      f'{s["final_min_test_accuracy"]:.4f}', f'{s["final_avg_model_test_accuracy"]:.4f}',
      f'{s["final_consensus_distance"]:.3e}', f'{s["bytes_sent_per_peer"] / 1e6:.1f}']))
PY
    done
done
column -s, -t <"$csv"
