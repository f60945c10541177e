#!/usr/bin/env bash
# murmur on a GPU, checked in one short run: several peers sharing one GPU, throughput
# against PyTorch on the same device, and the device↔host cost of a gossip round.
#
#   experiments/gpu/check.sh OUT_DIR                    # on a machine with an NVIDIA GPU
#   DEVICE=cpu QUICK=1 experiments/gpu/check.sh OUT_DIR  # the same steps on the CPU (tests the script)
#
# Needs a `murmur` built with `cargo build --release -p murmur --features cuda` (for
# DEVICE=cpu any build), python3 with torch for the PyTorch side, and nvidia-smi. No Rust
# toolchain, no network. Every step has its own time limit and the steps after BUDGET_S
# seconds are skipped, so the whole script ends in about 8 minutes on an H100/H200; a step
# that fails is recorded and the next one runs. Everything lands in OUT_DIR:
#
#   env.txt                   the GPU, driver, CUDA, torch and murmur versions
#   smoke.log                 a first 2-step bench: the script stops here, fast, if murmur
#                             cannot train on the device at all
#   murmur.jsonl, pytorch.jsonl, compare.txt
#                             `murmur bench` and pytorch_bench.py, mlp / resnet20 /
#                             transformer at batch 128, and their ratio
#   dmon-<model>.txt          nvidia-smi dmon (SM and memory utilisation, 1 s) during
#                             each murmur bench: a low SM share means the host, not the
#                             GPU, sets the pace
#   runs/gpu-n4, runs/gpu-n8  `murmur launch --peers 4 / 8` (MNIST MLP, D-PSGD) run folders
#   gpumem-n4.csv, gpumem-n8.csv
#                             nvidia-smi --query-compute-apps samples (pid, MiB) every 0.5 s
#   profile-<model>/cubecl.log
#                             CubeCL's kernel profile of 2 resnet20 / transformer steps
#   runs/gpu-diloco-n4        if time remains: the language model with DiLoCo, 4 peers
#   summary.md, summary.json  what the issue asks for, read from the files above
#
# Environment: MURMUR (default: .gpu/murmur if present, else target/release/murmur),
# MURMUR_VS (a second murmur, e.g. the build before a change: its bench runs beside the
# first, model by model, into murmur-vs.jsonl), PYTHON (python3), DEVICE (cuda),
# BUDGET_S (420), QUICK=1 (fewer steps and epochs).
set -uo pipefail

out="${1:?usage: experiments/gpu/check.sh OUT_DIR}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
device="${DEVICE:-cuda}"
python="${PYTHON:-python3}"
budget="${BUDGET_S:-420}"
quick="${QUICK:-0}"
if [[ -n "${MURMUR:-}" ]]; then
    murmur="$MURMUR"
elif [[ -x "$repo/.gpu/murmur" ]]; then
    murmur="$repo/.gpu/murmur"
else
    murmur="$repo/target/release/murmur"
fi
murmur="$(cd "$(dirname "$murmur")" 2>/dev/null && pwd)/$(basename "$murmur")"
murmur_vs="${MURMUR_VS:-}"
mkdir -p "$out/runs"
out="$(cd "$out" && pwd)"
start=$SECONDS
say() { printf '[check %4ds] %s\n' $((SECONDS - start)) "$*" | tee -a "$out/check.log"; }
left() { echo $((budget - (SECONDS - start))); }
fail() { say "check.sh: $*"; exit 2; }

[[ -x "$murmur" ]] || fail "no murmur binary at $murmur (set MURMUR=…)"
case "$device" in
cpu) smi=false ;;
cuda | cuda:*)
    smi=true
    command -v nvidia-smi >/dev/null ||
        fail "no NVIDIA driver on this machine (nvidia-smi not found); nothing was run"
    nvidia-smi -L >/dev/null 2>&1 ||
        fail "nvidia-smi finds no GPU ($(nvidia-smi -L 2>&1 | head -n 1)); nothing was run"
    # The driver library, where the loader's cache does not know it (a mounted driver).
    if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so'; then
        libcuda="$(find /usr/local/nvidia /usr/lib64 /usr/lib -name 'libcuda.so*' 2>/dev/null | head -n 1)"
        [[ -n "$libcuda" ]] && export LD_LIBRARY_PATH="$(dirname "$libcuda")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    fi
    # burn-cuda compiles its kernels at run time with NVRTC, against the CUDA headers.
    if [[ -z "${CUDA_PATH:-}" ]]; then
        if [[ -d /usr/local/cuda ]]; then
            export CUDA_PATH=/usr/local/cuda
        elif command -v nvcc >/dev/null; then
            CUDA_PATH="$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")"
            export CUDA_PATH
        fi
    fi
    nvrtc="$(find "${CUDA_PATH:-/nonexistent}" /usr/local/cuda* /usr/lib/x86_64-linux-gnu \
        -name 'libnvrtc.so*' 2>/dev/null | head -n 1)"
    [[ -n "$nvrtc" ]] || nvrtc="$("$python" -c 'import glob, nvidia, os
for p in nvidia.__path__:
    for f in glob.glob(os.path.join(p, "**", "libnvrtc.so*"), recursive=True):
        print(f); raise SystemExit' 2>/dev/null)"
    [[ -n "$nvrtc" ]] ||
        fail "no NVRTC library (libnvrtc.so) found: burn-cuda compiles its kernels with it; install the CUDA toolkit or set LD_LIBRARY_PATH"
    export LD_LIBRARY_PATH="$(dirname "$nvrtc")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    ;;
*) fail "DEVICE must be cpu, cuda or cuda:N, not $device" ;;
esac

{
    echo "date: $(date -u +%FT%TZ)"
    echo "host: $(uname -srm), $(nproc) CPUs"
    echo "murmur: $("$murmur" --version 2>&1)"
    echo "device: $device"
    if $smi; then
        nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
        echo "CUDA_PATH=${CUDA_PATH:-}"
        echo "nvrtc: $nvrtc"
        command -v nvcc >/dev/null && nvcc --version | tail -n 2
    fi
    [[ -n "$murmur_vs" ]] && echo "murmur (vs): $murmur_vs"
    "$python" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda,
        torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU",
        "| cudnn.allow_tf32", torch.backends.cudnn.allow_tf32,
        "| float32 matmul precision", torch.get_float32_matmul_precision())' 2>&1
} >"$out/env.txt"
cat "$out/env.txt"

# 0. Can murmur train on the device at all? (kernel compilation, driver, NVRTC)
say "smoke: murmur bench --device $device --model mlp, 2 steps"
if ! timeout 180 "$murmur" bench --device "$device" --model mlp --batch-size 32 --steps 2 \
    --warmup 1 --json >"$out/smoke.log" 2>&1; then
    tail -n 30 "$out/smoke.log"
    fail "murmur cannot train on $device (the smoke bench failed; $out/smoke.log); nothing else was run"
fi
say "smoke ok: $(tail -n 1 "$out/smoke.log")"

# The GPU memory taken by each process, sampled while a step runs.
sampler=""
sample_from() {
    $smi || return 0
    (while :; do
        nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null |
            sed "s/^/$(date +%s.%N), /"
        sleep 0.5
    done) >>"$1" &
    sampler=$!
}
stop_sampler() { [[ -n "$sampler" ]] && kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null; sampler=""; }
dmon=""
dmon_to() {
    $smi || return 0
    nvidia-smi dmon -s um -d 1 >"$1" 2>&1 &
    dmon=$!
}
stop_dmon() { [[ -n "$dmon" ]] && kill "$dmon" 2>/dev/null; wait "$dmon" 2>/dev/null; dmon=""; }
trap 'stop_sampler; stop_dmon' EXIT

# 1. Throughput: murmur bench and pytorch_bench.py, batch 128, the same device.
steps=20 warmup=5
[[ "$quick" == 1 ]] && steps=3 warmup=1
for model in mlp resnet20 transformer; do
    [[ $(left) -gt 30 ]] || { say "bench $model skipped: budget spent"; continue; }
    say "bench: murmur $model"
    dmon_to "$out/dmon-$model.txt"
    timeout 120 "$murmur" bench --device "$device" --model "$model" --batch-size 128 \
        --steps "$steps" --warmup "$warmup" --json >>"$out/murmur.jsonl" 2>>"$out/bench.log" ||
        say "murmur bench $model failed (exit $?): see bench.log"
    stop_dmon
    if [[ -n "$murmur_vs" ]]; then
        say "bench: the other murmur ($murmur_vs) $model"
        timeout 120 "$murmur_vs" bench --device "$device" --model "$model" --batch-size 128 \
            --steps "$steps" --warmup "$warmup" --json >>"$out/murmur-vs.jsonl" 2>>"$out/bench.log" ||
            say "the other murmur's bench $model failed (exit $?): see bench.log"
    fi
done
say "bench: pytorch_bench.py (all three)"
timeout 180 "$python" "$repo/experiments/bench/pytorch_bench.py" --model all --device "$device" \
    --batch-size 128 --steps "$steps" --warmup "$warmup" --json >"$out/pytorch.jsonl" \
    2>>"$out/bench.log" || say "pytorch_bench.py failed (exit $?): see bench.log"
"$python" "$repo/experiments/bench/compare.py" "$out/murmur.jsonl" "$out/pytorch.jsonl" \
    >"$out/compare.txt" 2>&1
cat "$out/compare.txt"

# 2. Several peers sharing the device: MNIST MLP, D-PSGD on a ring.
epochs=10
[[ "$quick" == 1 ]] && epochs=2
for n in 4 8; do
    limit=$(($(left) > 150 ? 150 : $(left)))
    [[ $limit -gt 30 ]] || { say "launch --peers $n skipped: budget spent"; continue; }
    say "launch: $n peers on $device, $epochs epochs (limit ${limit}s)"
    sample_from "$out/gpumem-n$n.csv"
    timeout "$limit" "$murmur" launch --device "$device" --peers "$n" --epochs "$epochs" \
        --out "$out/runs" --run-id "gpu-n$n" >"$out/launch-n$n.log" 2>&1 ||
        say "launch --peers $n failed (exit $?): see launch-n$n.log"
    stop_sampler
    tail -n 4 "$out/launch-n$n.log"
done

# 3. Where murmur's step spends its time on the device: CubeCL's own profiler (kernel
#    names and durations, a summary at every synchronisation), 2 steps of each model.
for model in resnet20 transformer; do
    [[ $(left) -gt 120 ]] || { say "profile $model skipped: budget spent"; continue; }
    [[ "$device" == cpu ]] && { say "profile $model: CubeCL's profiler is for the GPU only"; continue; }
    say "profile: murmur bench $model under CubeCL's profiler"
    dir="$out/profile-$model"
    mkdir -p "$dir"
    printf '[profiling.logger]\nlevel = "basic"\nfile = "%s"\n' "$dir/cubecl.log" >"$dir/cubecl.toml"
    (cd "$dir" && timeout 60 "$murmur" bench --device "$device" --model "$model" --batch-size 128 \
        --steps 2 --warmup 2 --json >"$dir/bench.jsonl" 2>"$dir/bench.log") ||
        say "profile $model failed (exit $?)"
done

# 4. If time remains: the language model of RESULTS §6 with DiLoCo (int8), 4 peers.
limit=$(($(left) - 10))
if [[ $limit -gt 45 ]]; then
    say "launch: DiLoCo language model, 4 peers (limit ${limit}s)"
    lm_epochs=2
    [[ "$quick" == 1 ]] && lm_epochs=1
    sample_from "$out/gpumem-diloco.csv"
    timeout "$limit" "$murmur" launch --device "$device" --peers 4 --model transformer \
        --epochs "$lm_epochs" --algorithm diloco --local-steps 50 --compressor int8 \
        --optimizer adamw --lr 0.002 --lr-schedule cosine --warmup-rounds 20 --sample 0 \
        --out "$out/runs" --run-id gpu-diloco-n4 >"$out/launch-diloco.log" 2>&1 ||
        say "the DiLoCo run failed or ran out of time (exit $?): see launch-diloco.log"
    stop_sampler
    tail -n 4 "$out/launch-diloco.log"
else
    say "DiLoCo language model skipped: ${limit}s left"
fi

"$python" "$here/summarize.py" "$out" || say "summarize.py failed"
say "done in $((SECONDS - start)) s; summary in $out/summary.md"
