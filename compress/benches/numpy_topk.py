#!/usr/bin/env python3
"""numpy's top-k selection on the throughput bench's input, for comparison with TopK.

How to run (from the repository root):

    pip install numpy
    cargo bench -p murmur-compress --bench throughput -- 25600000   # once: writes the input
    python3 compress/benches/numpy_topk.py [--runs 7] [--ratio 0.01] [--file PATH]

The bench writes its exact d = 25,600,000 input (standard normal, fixed seed) as raw
little-endian f32 to <target>/bench-data/normal-25600000.f32, where <target> is
$CARGO_TARGET_DIR or else the workspace's target/ (or pass --file).

Timed, single call each, k = ceil(ratio·d):
  - abs+argpartition: np.argpartition(np.abs(x), d - k)[d - k:]   (top-k by magnitude,
    what TopK computes, less the sort of the indices and the message)
  - argpartition:     np.argpartition(x, d - k)[d - k:]           (no abs pass)
Prints best and median of --runs runs, in ms and in GB/s of input (4·d bytes / time).
numpy's argpartition is introselect on one thread.
"""

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np


def default_file():
    target = os.environ.get("CARGO_TARGET_DIR")
    target = Path(target) if target else Path(__file__).resolve().parents[2] / "target"
    return target / "bench-data" / "normal-25600000.f32"


def timed(fn, runs):
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
        del out
    return min(times), statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--file", type=Path, default=None, help="raw little-endian f32 input")
    ap.add_argument("--runs", type=int, default=7, help="runs per variant (default 7)")
    ap.add_argument("--ratio", type=float, default=0.01, help="k/d (default 0.01)")
    args = ap.parse_args()

    path = args.file or default_file()
    if not path.is_file():
        sys.exit(f"{path} not found: run `cargo bench -p murmur-compress --bench throughput "
                 "-- 25600000` once first (it writes the input there)")
    x = np.fromfile(path, dtype="<f4")
    d = x.size
    k = max(1, min(d, math.ceil(args.ratio * d)))
    nbytes = 4 * d
    print(f"{path}: d = {d:,}, k = {k:,} ({args.ratio:g}), numpy {np.__version__}, "
          f"{args.runs} runs each")

    # Sanity: the selection is the top-k by magnitude.
    top = np.argpartition(np.abs(x), d - k)[d - k:]
    assert top.size == k and np.count_nonzero(np.abs(x) > np.abs(x[top]).min()) < k

    variants = [
        ("abs+argpartition", lambda: np.argpartition(np.abs(x), d - k)[d - k:]),
        ("argpartition", lambda: np.argpartition(x, d - k)[d - k:]),
    ]
    for name, fn in variants:
        best, median = timed(fn, args.runs)
        print(f"{name:>17}: best {best * 1e3:8.2f} ms ({nbytes / best / 1e9:5.2f} GB/s)   "
              f"median {median * 1e3:8.2f} ms ({nbytes / median / 1e9:5.2f} GB/s)")


if __name__ == "__main__":
    main()
