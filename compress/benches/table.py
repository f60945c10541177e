#!/usr/bin/env python3
"""Markdown table of the throughput benchmark (benches/throughput.rs), from criterion's files.

How to run (from the repository root; Python 3.8+, standard library only):

    cargo bench -p murmur-compress --bench throughput        # writes <target>/criterion/
    python3 compress/benches/table.py                        # prints the table
    python3 compress/benches/table.py --target /path/to/target --estimate mean

<target> is --target, else $CARGO_TARGET_DIR, else the workspace's target/ (the same
directory criterion wrote to when the bench ran with the same environment).

For each benchmark `d=<d>/<compress|decode_add|memcpy>/<operator>` it reads
`new/benchmark.json` (the throughput: 4·d bytes of f32 input) and `new/estimates.json`
(time per call, ns) and prints GB/s of input (10^9 bytes/s; criterion's console prints
GiB/s) and the ratio to the memcpy of the same d. criterion keeps the latest result of each
benchmark: after a filtered run, rows from an older run are marked with † when their files
are more than --same-run minutes apart from that d's memcpy.
"""

import argparse
import json
import os
import sys
from pathlib import Path

# Row order of benches/throughput.rs; operators not listed here follow, sorted.
ORDER = [
    "identity",
    "topk-1%",
    "approx-topk-1%",
    "randk-1%-scaled",
    "qsgd-s15-b512",
    "sign",
    "terngrad",
    "natural",
    "fp16",
    "bf16",
]


def target_dir(arg):
    if arg:
        return Path(arg)
    if os.environ.get("CARGO_TARGET_DIR"):
        return Path(os.environ["CARGO_TARGET_DIR"])
    return Path(__file__).resolve().parents[2] / "target"


def load(criterion, estimate):
    """{(d, kind, operator): (seconds per call, bytes per call, mtime)} of every result."""
    results = {}
    for bench in criterion.glob("d=*/*/*/new/benchmark.json"):
        meta = json.loads(bench.read_text())
        group = meta.get("group_id", "")
        if not group.startswith("d="):
            continue
        est_path = bench.with_name("estimates.json")
        if not est_path.is_file():
            continue
        est = json.loads(est_path.read_text())
        point = (est.get(estimate) or est["mean"])["point_estimate"]  # slope: absent if flat
        nbytes = (meta.get("throughput") or {}).get("Bytes")
        if nbytes is None:
            continue
        d = int(group[2:])
        results[(d, meta["function_id"], meta["value_str"])] = (
            point * 1e-9,
            nbytes,
            est_path.stat().st_mtime,
        )
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", help="cargo target directory (holds criterion/)")
    ap.add_argument(
        "--estimate",
        default="median",
        choices=["median", "mean", "slope"],
        help="criterion estimate of the time per call (default: median; slope falls back "
        "to mean for the flat-sampled d = 25.6M)",
    )
    ap.add_argument(
        "--same-run",
        type=float,
        default=30.0,
        metavar="MIN",
        help="mark results more than MIN minutes apart from their memcpy (default 30)",
    )
    args = ap.parse_args()

    criterion = target_dir(args.target) / "criterion"
    results = load(criterion, args.estimate)
    if not results:
        sys.exit(f"no throughput results under {criterion}: run "
                 "`cargo bench -p murmur-compress --bench throughput` first")

    def gbps(key):
        secs, nbytes, _ = results[key]
        return nbytes / secs / 1e9

    print(f"Single thread, GB/s of f32 input (4·d bytes); criterion {args.estimate}; "
          f"ratios to the memcpy of the same d.\n")
    print("| operator | d | compress GB/s | decompress-and-add GB/s |")
    print("|---|---:|---:|---:|")
    stale = False
    for d in sorted({k[0] for k in results}):
        memcpy = results.get((d, "memcpy", "memcpy"))
        ops = {k[2] for k in results if k[0] == d and k[1] != "memcpy"}
        ops = [o for o in ORDER if o in ops] + sorted(ops - set(ORDER))

        def cell(kind, op):
            nonlocal stale
            key = (d, kind, op)
            if key not in results:
                return "–"
            text = f"{gbps(key):.2f}"
            if memcpy is not None:
                text += f" ({gbps(key) / gbps((d, 'memcpy', 'memcpy')):.2f}× memcpy)"
                if abs(results[key][2] - memcpy[2]) > 60 * args.same_run:
                    text += " †"
                    stale = True
            return text

        if memcpy is not None:
            m = f"{gbps((d, 'memcpy', 'memcpy')):.2f}"
            print(f"| memcpy | {d:,} | {m} | {m} |")
        for op in ops:
            print(f"| {op} | {d:,} | {cell('compress', op)} | {cell('decode_add', op)} |")
    if stale:
        print(f"\n† measured more than {args.same_run:g} min apart from the memcpy of its d "
              "(probably another run).")


if __name__ == "__main__":
    main()
