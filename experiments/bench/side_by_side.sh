#!/usr/bin/env bash
# Run `murmur bench` and pytorch_bench.py with the same arguments, then compare.
#
#   experiments/bench/side_by_side.sh --model resnet20 --batch-size 128
#   MURMUR=./target/release/murmur PYTHON=python3 experiments/bench/side_by_side.sh --model all
#
# The arguments are passed unchanged to both (so use options both accept: --model,
# --batch-size, --steps, --warmup, --device (murmur's `libtorch` is PyTorch's cpu); --threads is pytorch_bench.py's alone: murmur uses
# every core, set RAYON_NUM_THREADS to limit it); --json is added. The raw JSON
# lines are kept in $OUT_DIR (default: a temporary directory) as murmur.jsonl and
# pytorch.jsonl.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
murmur="${MURMUR:-./target/release/murmur}"
python="${PYTHON:-python3}"
out="${OUT_DIR:-$(mktemp -d)}"
mkdir -p "$out"
"$murmur" bench "$@" --json | tee "$out/murmur.jsonl"
"$python" "$here/pytorch_bench.py" "$@" --json | tee "$out/pytorch.jsonl"
echo
"$python" "$here/compare.py" "$out/murmur.jsonl" "$out/pytorch.jsonl"
echo "(raw results in $out)"
