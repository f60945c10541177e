#!/usr/bin/env python3
"""A run's wall time against its link-rate bound, from its run folder.

The bound of a run whose peers each send over `--links` links of `--rate` at once is the
bytes each peer sent (the record's last epoch row: `bytes_sent_per_peer`, the mean over
the peers of the run so far) over its links at that rate, plus the compute seconds of the
same row (`compute_seconds`, mean over the peers, so far): the time the run would take if
every byte left at the link's rate and computing never overlapped sending. Prints one
JSON object, seconds: wall (the row's `wall_seconds`, peer 0's since training started),
compute, link (the bytes' time on the links), bound and wall / bound.

    experiments/cluster/link_bound.py OUT/run --rate 1gbit --links 2

A ring's peer sends to 2 neighbours (`--links 2`); each link is shaped separately by
netns-ring.sh, so they run side by side. TCP/IP's headers are not counted: the bound is
about 3% below what a 1,500-byte MTU lets through.
"""
import argparse
import json
import re
import sys


def rate(text):
    """tc's rate units (`1gbit`, `100mbit`, `500kbit`) in bytes per second."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kmg]?)bit", text.lower())
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r}: a rate such as 1gbit or 100mbit")
    return float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)] / 8


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", help="the run folder (epochs.jsonl inside)")
    p.add_argument("--rate", type=rate, required=True, help="each link's rate, e.g. 1gbit")
    p.add_argument("--links", type=int, default=2, help="links each peer sends on at once")
    a = p.parse_args()
    try:
        rows = [json.loads(line) for line in open(f"{a.run}/epochs.jsonl") if line.strip()]
    except OSError as e:
        sys.exit(f"link_bound.py: {e}")
    if not rows:
        sys.exit(f"link_bound.py: {a.run}/epochs.jsonl has no epoch")
    last = max(rows, key=lambda r: r["epoch"])
    sent, compute, wall = last["bytes_sent_per_peer"], last["compute_seconds"], last["wall_seconds"]
    link = sent / a.links / a.rate
    bound = link + compute
    print(json.dumps({"wall": round(wall, 3), "compute": round(compute, 3),
                      "link": round(link, 3), "bound": round(bound, 3),
                      "wall_over_bound": round(wall / bound, 3)}))


if __name__ == "__main__":
    main()
