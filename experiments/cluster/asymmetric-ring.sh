#!/usr/bin/env bash
# choco-auto on an 8-peer ring with one asymmetric link (netns-ring.sh: every link
# 200 Mbit/s, the direction 3 -> 4 at 20 Mbit/s, 4 -> 3 fast), 16 rounds, then the check
# of .ci/net-test (b): peer 3 must compress towards 4 with top-k and stay dense towards 2,
# and peer 4 must stay dense towards 3 (it learns its direction from peer 3's reports).
#
#   sudo experiments/cluster/asymmetric-ring.sh OUT [murmur peer options, e.g. --transport quic]
#
# Prints the three links' last `link` lines, then PASS, or FAIL and why (exit 1). MURMUR
# names the binary, as for netns-ring.sh. Repeat it to count how often the meter gets the
# links right: `for i in $(seq 12); do sudo experiments/cluster/asymmetric-ring.sh OUT; done`.
set -euo pipefail
OUT=${1:?usage: asymmetric-ring.sh OUT [murmur peer options…]}
shift
here=$(dirname "$(realpath "$0")")
rm -rf "$OUT"
FAST=200mbit SLOW=20mbit SLOW_ONEWAY=1 PEERS=8 "$here/netns-ring.sh" "$OUT" \
    --algorithm choco-auto --epochs 1 --rounds-per-epoch 16 "$@" \
    2> >(grep -v "quantum of class" >&2) >/dev/null ||
    { echo "asymmetric-ring.sh: the ring run failed (logs in $OUT)" >&2; exit 1; }
last_link() { sed 's/\x1b\[[0-9;]*m//g' "$OUT/peer-$1.log" | grep " link to=$2 " | tail -1; }
slow=$(last_link 3 4)
fast=$(last_link 3 2)
back=$(last_link 4 3)
echo "peer 3: ${slow#*run: }"
echo "peer 3: ${fast#*run: }"
echo "peer 4: ${back#*run: }"
why=""
[[ $slow == *"compressor=topk"* ]] || why="peer 3 did not compress its slow link to 4 with top-k"
[[ $fast == *"compressor=identity"* ]] || why="peer 3 compressed its fast link to 2"
[[ $back == *"compressor=identity"* ]] || why="peer 4 compressed its fast direction to 3"
if [[ -n $why ]]; then
    echo "FAIL: $why"
    exit 1
fi
echo "PASS"
