#!/usr/bin/env python3
"""Compare `murmur bench --json` with `pytorch_bench.py --json`: samples/s ratio per model.

Reads JSON objects from the files named on the command line, or from standard input when
none (or `-`) is given. Objects may be one per line or pretty-printed; text that is not
JSON (log lines) is skipped. An object is a PyTorch result when it has
`"framework": "pytorch"` or a `torch_version` field, and a murmur result otherwise.

Fields used, from both sides:
    model               "mlp", "resnet20" or "transformer"   (required)
    samples_per_second  training samples per second of the whole step (required;
                        murmur bench writes it as `step_samples_per_second`: forward,
                        backward, gradient to the host, update, unflatten)
    batch_size          samples per step                     (optional; results are
                        paired by (model, batch_size), so a missing one pairs with any)
    device              shown when present                   (optional)

    { ./target/release/murmur bench --model all --json
      python3 experiments/bench/pytorch_bench.py --model all --json; } \\
      | python3 experiments/bench/compare.py
    python3 experiments/bench/compare.py murmur.jsonl pytorch.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys


def read_objects(text: str) -> list:
    """Every top-level JSON object in `text` (lines or pretty-printed), in order."""
    decoder = json.JSONDecoder()
    objects, i = [], 0
    while True:
        i = text.find("{", i)
        if i < 0:
            return objects
        try:
            obj, end = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            i += 1
            continue
        if isinstance(obj, dict) and "samples_per_second" not in obj:
            # murmur bench: the whole training step is `step_samples_per_second`.
            if "step_samples_per_second" in obj:
                obj = dict(obj, samples_per_second=obj["step_samples_per_second"])
        if isinstance(obj, dict) and "model" in obj and "samples_per_second" in obj:
            objects.append(obj)
        i = end


def is_pytorch(obj: dict) -> bool:
    """True for a pytorch_bench.py record."""
    return obj.get("framework") == "pytorch" or "torch_version" in obj


def pair(murmur: list, pytorch: list) -> list:
    """(murmur, pytorch) records with the same model and batch size (None if absent)."""
    rows, used = [], set()
    for m in murmur:
        match = None
        for j, p in enumerate(pytorch):
            if j in used or p["model"] != m["model"]:
                continue
            bm, bp = m.get("batch_size"), p.get("batch_size")
            if bm is None or bp is None or bm == bp:
                match = j
                break
        if match is not None:
            used.add(match)
        rows.append((m, pytorch[match] if match is not None else None))
    rows += [(None, p) for j, p in enumerate(pytorch) if j not in used]
    return rows


def fmt(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("files", nargs="*", help="JSON output files ('-' or none: stdin)")
    p.add_argument("--markdown", action="store_true", help="print a markdown table")
    args = p.parse_args(argv)

    text = ""
    for name in args.files or ["-"]:
        if name == "-":
            text += sys.stdin.read()
        else:
            with open(name, encoding="utf-8") as f:
                text += f.read()
    objects = read_objects(text)
    murmur = [o for o in objects if not is_pytorch(o)]
    pytorch = [o for o in objects if is_pytorch(o)]
    if not objects:
        sys.exit("compare.py: no results found (expected JSON objects with "
                 "'model' and 'samples_per_second')")

    header = ["model", "batch", "murmur samples/s", "PyTorch samples/s", "murmur/PyTorch",
              "murmur device", "PyTorch device"]
    rows = []
    for m, t in pair(murmur, pytorch):
        ref = m or t
        sm = m["samples_per_second"] if m else None
        st = t["samples_per_second"] if t else None
        ratio = sm / st if (sm is not None and st) else None
        rows.append([
            ref["model"],
            fmt(ref.get("batch_size"), ""),
            fmt(sm, ".1f"),
            fmt(st, ".1f"),
            fmt(ratio, ".3f"),
            str(m.get("device", "-")) if m else "-",
            str(t.get("device", "-")) if t else "-",
        ])

    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "|".join("---" for _ in header) + "|")
        for r in rows:
            print("| " + " | ".join(r) + " |")
    else:
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
        for r in [header] + rows:
            print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


if __name__ == "__main__":
    main()
