#!/usr/bin/env python3
"""Summarise an `experiments/gpu/check.sh` output folder into summary.md and summary.json.

    python3 experiments/gpu/summarize.py OUT_DIR

Reads what check.sh wrote (env.txt, murmur.jsonl, pytorch.jsonl, runs/*/epochs.csv and
summary.json, gpumem-*.csv, dmon-*.txt); a missing piece is reported as missing, never
invented. Standard library only.
"""

from __future__ import annotations

import collections
import csv
import json
import re
import statistics
import sys
from pathlib import Path

TARGET = 0.92  # the MNIST accuracy the README's run is timed to


def jsonl(path: Path) -> list:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return rows


def bench(out: Path) -> list:
    """One row per model: murmur and PyTorch samples/s, the ratios, the round's parts."""
    mm = {r["model"]: r for r in jsonl(out / "murmur.jsonl")}
    vs = {r["model"]: r for r in jsonl(out / "murmur-vs.jsonl")}
    pt = {r["model"]: r for r in jsonl(out / "pytorch.jsonl")}
    rows = []
    for model in ("mlp", "resnet20", "transformer"):
        m, p = mm.get(model), pt.get(model)
        row = {"model": model, "murmur": m is not None, "pytorch": p is not None}
        if m:
            row.update(
                d=m["dim"],
                murmur_step_samples_per_second=m["step_samples_per_second"],
                murmur_fwd_bwd_samples_per_second=m["forward_backward_samples_per_second"],
                step_seconds=m["step_seconds"],
                flatten_seconds=m["flatten_seconds"],
                unflatten_seconds=m["unflatten_seconds"],
                round_seconds=m["round_seconds"],
                message_bytes=m["message_bytes"],
                c2c_1gbps=m["c2c_1gbps"],
                c2c_10gbps=m["c2c_10gbps"],
                c2c_100gbps=m.get("c2c_100gbps"),
            )
        if p:
            row.update(
                pytorch_step_samples_per_second=p["samples_per_second"],
                pytorch_fwd_bwd_samples_per_second=p["batch_size"] / (p["fwd_bwd_ms_median"] / 1e3),
                pytorch_device_name=p.get("device_name"),
                torch_version=p.get("torch_version"),
            )
        if m and p:
            row["step_ratio"] = row["murmur_step_samples_per_second"] / row["pytorch_step_samples_per_second"]
            row["fwd_bwd_ratio"] = (
                row["murmur_fwd_bwd_samples_per_second"] / row["pytorch_fwd_bwd_samples_per_second"]
            )
        if model in vs:
            row["vs_step_samples_per_second"] = vs[model]["step_samples_per_second"]
            row["vs_fwd_bwd_samples_per_second"] = vs[model]["forward_backward_samples_per_second"]
        dmon = out / f"dmon-{model}.txt"
        if dmon.exists():
            sm = []
            for line in dmon.read_text().splitlines():
                f = line.split()
                if f and not line.startswith("#") and len(f) > 1 and f[1].isdigit():
                    sm.append(int(f[1]))
            if sm:
                row["sm_percent_max"] = max(sm)
                row["sm_percent_median"] = statistics.median(sm)
        rows.append(row)
    return rows


UNIT = {"s": 1.0, "ms": 1e-3, "µs": 1e-6, "ns": 1e-9}
ENTRY = re.compile(r"^\|\s*([\d.]+)(ms|µs|ns|s)\s*\|\s*(.*?)\s*\|?\s*$")


def kernel_profile(path: Path, top: int = 8) -> dict | None:
    """CubeCL's profile log: kernel durations summed by kernel name over the second half of
    the repeated launches (a kernel's first launch, which includes its compilation, and the
    warm-up are left out)."""
    if not path.exists():
        return None
    seen, repeated = set(), []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        m = ENTRY.match(line)
        if m:
            name = m.group(3).rstrip("|").strip()
            if name in seen:
                repeated.append((float(m.group(1)) * UNIT[m.group(2)], name))
            seen.add(name)
    agg = collections.defaultdict(lambda: [0, 0.0])
    for seconds, name in repeated[len(repeated) // 2:]:
        agg[name][0] += 1
        agg[name][1] += seconds
    total = sum(v[1] for v in agg.values())
    if not total:
        return None
    rows = sorted(agg.items(), key=lambda kv: -kv[1][1])[:top]
    return {"launches": sum(v[0] for v in agg.values()), "kernel_seconds": total,
            "top": [{"kernel": " / ".join(p.strip() for p in k.split("|") if p.strip())[:90], "launches": c, "seconds": t, "share": t / total}
                    for k, (c, t) in rows]}


def gpu_memory(path: Path) -> dict | None:
    """Peak MiB per process from nvidia-smi --query-compute-apps samples."""
    if not path.exists():
        return None
    peak: dict = {}
    for line in path.read_text().splitlines():
        f = [x.strip() for x in line.split(",")]
        if len(f) == 3 and f[2].isdigit():
            peak[f[1]] = max(peak.get(f[1], 0), int(f[2]))
    if not peak:
        return None
    v = sorted(peak.values())
    return {"processes": len(v), "peak_mib_max": v[-1], "peak_mib_median": statistics.median(v),
            "peak_mib_sum": sum(v)}


def run(folder: Path) -> dict | None:
    """Time to TARGET and the final accuracies of one launch run folder."""
    epochs = folder / "epochs.csv"
    if not epochs.exists():
        return None
    rows = list(csv.DictReader(epochs.open()))
    res = {"epochs_recorded": len(rows) - 1}
    hit = next((r for r in rows if float(r["mean_test_accuracy"]) >= TARGET), None)
    res["seconds_to_92"] = float(hit["wall_seconds"]) if hit else None
    res["epoch_to_92"] = int(hit["epoch"]) if hit else None
    last = rows[-1]
    res["final_mean_test_accuracy"] = float(last["mean_test_accuracy"])
    res["final_avg_model_test_accuracy"] = float(last["avg_model_test_accuracy"])
    res["wall_seconds"] = float(last["wall_seconds"])
    res["compute_seconds"] = float(last["compute_seconds"])
    res["wait_seconds"] = float(last["wait_seconds"])
    res["rounds"] = int(last["rounds"])
    summary = folder / "summary.json"
    if summary.exists():
        s = json.loads(summary.read_text())
        for k in ("outcome", "final_mean_test_bits_per_byte", "bytes_sent_per_peer", "samples_per_second"):
            if k in s:
                res[k] = s[k]
    return res


def pct(x):
    return "—" if x is None else f"{100 * x:.2f}%"


def num(x, fmt="{:.3g}"):
    return "—" if x is None else fmt.format(x)


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    env = (out / "env.txt").read_text() if (out / "env.txt").exists() else "(no env.txt)"
    result = {"env": env, "bench": bench(out), "runs": {}}
    for name, mem in (("gpu-n4", "gpumem-n4.csv"), ("gpu-n8", "gpumem-n8.csv"),
                      ("gpu-diloco-n4", "gpumem-diloco.csv")):
        r = run(out / "runs" / name)
        result["runs"][name] = {"run": r, "gpu_memory": gpu_memory(out / mem)}
    result["profiles"] = {m: kernel_profile(out / f"profile-{m}" / "cubecl.log")
                          for m in ("resnet20", "transformer")}
    (out / "summary.json").write_text(json.dumps(result, indent=2) + "\n")

    md = ["# murmur on the GPU: experiments/gpu/check.sh", "", "```text", env.strip(), "```", "",
          "## Throughput, batch 128 (medians; murmur's step includes the gradient to the host, "
          "the update on the flat vector and the parameters back)", "",
          "| model | d | murmur step samples/s | PyTorch step samples/s | ratio | murmur fwd+bwd | "
          "PyTorch fwd+bwd | ratio | SM % (max of 1 s samples) |", "|---|---|---|---|---|---|---|---|---|"]
    for b in result["bench"]:
        md.append(
            f"| {b['model']} | {b.get('d', '—')} | {num(b.get('murmur_step_samples_per_second'), '{:.0f}')} | "
            f"{num(b.get('pytorch_step_samples_per_second'), '{:.0f}')} | {num(b.get('step_ratio'), '{:.3f}')} | "
            f"{num(b.get('murmur_fwd_bwd_samples_per_second'), '{:.0f}')} | "
            f"{num(b.get('pytorch_fwd_bwd_samples_per_second'), '{:.0f}')} | {num(b.get('fwd_bwd_ratio'), '{:.3f}')} | "
            f"{num(b.get('sm_percent_max'), '{:.0f}')} |")
    if any("vs_step_samples_per_second" in b for b in result["bench"]):
        md += ["", "## The other murmur (MURMUR_VS), same run", "",
               "| model | this step samples/s | other step samples/s | this/other | this fwd+bwd | other fwd+bwd |",
               "|---|---|---|---|---|---|"]
        for b in result["bench"]:
            if "vs_step_samples_per_second" in b and b["murmur"]:
                md.append(
                    f"| {b['model']} | {b['murmur_step_samples_per_second']:.0f} | "
                    f"{b['vs_step_samples_per_second']:.0f} | "
                    f"{b['murmur_step_samples_per_second'] / b['vs_step_samples_per_second']:.2f} | "
                    f"{b['murmur_fwd_bwd_samples_per_second']:.0f} | {b['vs_fwd_bwd_samples_per_second']:.0f} |")
    for model, prof in result["profiles"].items():
        if prof:
            md += ["", f"## Where {model}'s device time goes (CubeCL profile, {prof['launches']} launches, "
                   f"{1e3 * prof['kernel_seconds']:.1f} ms of kernels)", "",
                   "| kernel | launches | ms | share |", "|---|---|---|---|"]
            for k in prof["top"]:
                md.append(f"| {k['kernel']} | {k['launches']} | {1e3 * k['seconds']:.2f} | {100 * k['share']:.1f}% |")
    md += ["", "## A gossip round's device↔host cost and the C2C it implies (2 messages per step)", "",
           "| model | step ms | flatten ms | unflatten ms | message bytes | C2C 1 Gb/s | 10 Gb/s | 100 Gb/s |",
           "|---|---|---|---|---|---|---|---|"]
    for b in result["bench"]:
        if b["murmur"]:
            md.append(
                f"| {b['model']} | {1e3 * b['step_seconds']:.3f} | {1e3 * b['flatten_seconds']:.3f} | "
                f"{1e3 * b['unflatten_seconds']:.3f} | {b['message_bytes']} | {b['c2c_1gbps']:.3g} | "
                f"{b['c2c_10gbps']:.3g} | {num(b.get('c2c_100gbps'))} |")
    md += ["", "## Peers sharing the device", "",
           "| run | epoch to 92% | seconds to 92% | final acc (peers) | final acc x̄ | wall s | "
           "wait s | processes | peak MiB per process (max / median) |", "|---|---|---|---|---|---|---|---|---|"]
    for name, r in result["runs"].items():
        run_, mem = r["run"], r["gpu_memory"]
        if run_ is None:
            md.append(f"| {name} | not run or no epochs.csv | | | | | | | |")
            continue
        memtxt = f"{mem['processes']} | {mem['peak_mib_max']} / {mem['peak_mib_median']:.0f}" if mem else "— | —"
        md.append(
            f"| {name} | {num(run_['epoch_to_92'], '{}')} | {num(run_['seconds_to_92'], '{:.1f}')} | "
            f"{pct(run_['final_mean_test_accuracy'])} | {pct(run_['final_avg_model_test_accuracy'])} | "
            f"{run_['wall_seconds']:.1f} | {run_['wait_seconds']:.1f} | {memtxt} |")
        if "final_mean_test_bits_per_byte" in run_:
            md.append(f"|   (bits per byte {run_['final_mean_test_bits_per_byte']:.3f}) | | | | | | | | |")
    (out / "summary.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
