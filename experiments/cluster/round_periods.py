#!/usr/bin/env python3
"""The round period of a peer from its log: the gaps between its `round begins` lines.

    MURMUR_LOG=info,murmur::peer::run=debug experiments/cluster/netns-ring.sh OUT ...
    experiments/cluster/round_periods.py OUT/peer-1.log [more logs]

Each peer logs `round begins` at the debug level when a round starts (`node/src/peer/run.rs`).
The first two gaps (links opening, the report of epoch 0) are left out, and so is any gap
over 3x the median (an epoch's evaluation and report). Prints, per log, the number of gaps
kept, their median and their mean in seconds.
"""
import datetime
import statistics
import sys


def gaps(path):
    times = []
    for line in open(path, errors="replace"):
        if "round begins" in line:
            stamp = line.split()[0].replace("Z", "+00:00")
            times.append(datetime.datetime.fromisoformat(stamp).timestamp())
    d = [b - a for a, b in zip(times, times[1:])][2:]
    if not d:
        sys.exit(f"round_periods.py: {path}: fewer than 4 `round begins` lines "
                 "(run the peers with MURMUR_LOG=info,murmur::peer::run=debug)")
    m = statistics.median(d)
    return [g for g in d if g < 3 * m]


if len(sys.argv) < 2:
    sys.exit(__doc__)
for path in sys.argv[1:]:
    g = gaps(path)
    print(f"{path}: {len(g)} rounds, median {statistics.median(g):.3f} s, "
          f"mean {statistics.mean(g):.3f} s")
