#!/usr/bin/env python3
"""Chaos through `murmur launch`: kill -9 and pause (SIGSTOP, then SIGCONT) peer processes at
random times of one run, peer 0 included, and check what a user would: the launcher exits 0,
`epochs.jsonl` has every epoch once, and the final mean test accuracy reaches the bar.

Usage (from the repository root, after `cargo build --release`):
    python3 experiments/chaos/run.py [--kills 10] [--pauses 3] [--epochs 60] [--seed 1]
        [--pause-secs 2] [--bar 0.93] [--out /tmp/murmur-chaos] [-- extra launch options]

Faults start once epoch 1 is recorded and stop three epochs before the end (a peer killed in
the last epoch is not restarted). The timeline of every fault, with the epoch recorded when
it happened, is printed and written to <out>/chaos.json. Exit status 0 when every check
holds, 1 otherwise.
"""
import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path


def epochs_recorded(run):
    path = run / "epochs.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line)["epoch"])
        except (ValueError, KeyError):
            pass  # a line being written
    return out


def peer_pids(out):
    """rank -> pid of the live `murmur peer` processes of this launch's run folder."""
    pids = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().split(") ")[-1][0]
        except OSError:
            continue
        args = [a.decode(errors="replace") for a in argv]
        if state == "Z" or len(args) < 2 or args[1] != "peer":
            continue
        if not any(a.startswith(f"--out={out}") for a in args):
            continue
        rank = next((a.split("=", 1)[1] for a in args if a.startswith("--rank=")), None)
        if rank is not None:
            pids[int(rank)] = int(entry.name)
    return pids


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=10)
    ap.add_argument("--pauses", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=60)
    ap.add_argument("--peers", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--pause-secs", type=float, default=2.0)
    ap.add_argument("--bar", type=float, default=0.93)
    ap.add_argument("--out", default="/tmp/murmur-chaos")
    ap.add_argument("--murmur", default="target/release/murmur")
    ap.add_argument("extra", nargs="*", help="more `murmur launch` options (after --)")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    out = Path(a.out).resolve()
    if out.exists():
        subprocess.run(["rm", "-rf", str(out)], check=True)
    out.mkdir(parents=True)
    cmd = [a.murmur, "launch", f"--peers={a.peers}", f"--epochs={a.epochs}",
           "--checkpoint-every=32", f"--restart-failed={a.kills + 1}", f"--out={out}"] + a.extra
    log = open(out / "launch.log", "w")
    t0 = time.monotonic()
    launch = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    run = None
    while run is None and launch.poll() is None:
        runs = [d for d in out.iterdir() if d.is_dir()]
        run = runs[0] if runs else None
        time.sleep(0.1)
    while launch.poll() is None and not epochs_recorded(run):
        time.sleep(0.1)
    # Faults at random times over the middle of the run, measured in recorded epochs.
    faults = ["kill"] * a.kills + ["pause"] * a.pauses
    rng.shuffle(faults)
    timeline = []
    last_epoch = a.epochs - 3
    for i, kind in enumerate(faults):
        due = 1 + (last_epoch - 1) * (i + rng.random()) / len(faults)
        while launch.poll() is None and (max(epochs_recorded(run), default=0) < due):
            time.sleep(0.05)
        if launch.poll() is not None:
            break
        pids = peer_pids(out)
        if not pids:
            continue
        rank = rng.choice(sorted(pids))
        epoch = max(epochs_recorded(run), default=0)
        at = round(time.monotonic() - t0, 2)
        if kind == "kill":
            os.kill(pids[rank], signal.SIGKILL)
        else:
            os.kill(pids[rank], signal.SIGSTOP)
            time.sleep(a.pause_secs)
            os.kill(pids[rank], signal.SIGCONT)
        timeline.append({"fault": kind, "rank": rank, "epoch": epoch, "seconds": at})
        print(f"{at:7.2f} s  epoch {epoch:3d}  {kind:5s} peer {rank}", flush=True)
        # Let the restart settle before the next fault.
        time.sleep(0.5)
    status = launch.wait()
    wall = time.monotonic() - t0
    log.close()
    epochs = epochs_recorded(run)
    summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").exists() else {}
    acc = summary.get("final_mean_test_accuracy", 0.0)
    checks = {
        "launch exited 0": status == 0,
        "every epoch recorded once": epochs == list(range(a.epochs + 1)),
        f"final mean accuracy >= {a.bar}": acc >= a.bar,
        f"{a.kills} kills and {a.pauses} pauses done": len(timeline) == len(faults),
    }
    result = {"command": cmd, "wall_seconds": round(wall, 1), "exit": status,
              "final_mean_test_accuracy": acc, "faults": timeline,
              "departures": summary.get("departures", ""), "rejoins": summary.get("rejoins", ""),
              "peer_failures": summary.get("peer_failures", ""), "checks": checks,
              "run": str(run)}
    (out / "chaos.json").write_text(json.dumps(result, indent=1))
    print(f"run {run}: exit {status}, {wall:.1f} s, final mean accuracy {acc:.4f}")
    if epochs != list(range(a.epochs + 1)):
        print(f"epochs recorded: {epochs}")
    for name, ok in checks.items():
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    if not all(checks.values()):
        tail = (out / "launch.log").read_text().splitlines()[-15:]
        print("\n".join(tail))
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
