#!/usr/bin/env bash
# A fault with no supervisor: four `murmur peer` processes started by hand on this machine
# (a ring, 6 epochs of 25 rounds), one of them stopped (SIGSTOP) for a while or killed
# (SIGKILL) once epoch 1 is recorded. Prints each peer's exit status, the seconds from the
# fault to the survivors' end and the run's membership.jsonl (departures, with their
# reasons); the logs stay in OUT/peer-<r>.log.
#
#   experiments/cluster/by-hand-fault.sh OUT [murmur peer options…]
#
# Environment: MURMUR (the binary; default target/release/murmur), FAULT (stop, the default,
# or kill), SECS (how long a stopped peer stays stopped; 8), VICTIM (its rank; 2),
# TRANSPORT (auto, the default: shared memory between peers of one host; tcp: the path
# between hosts, on loopback).
set -euo pipefail

OUT=${1:?usage: by-hand-fault.sh OUT [murmur peer options…]}
shift
MURMUR=${MURMUR:-target/release/murmur}
FAULT=${FAULT:-stop}
SECS=${SECS:-8}
VICTIM=${VICTIM:-2}
TRANSPORT=${TRANSPORT:-auto}
case $FAULT in stop | kill) ;; *) echo "FAULT must be stop or kill, not $FAULT" >&2; exit 2 ;; esac

rm -rf "$OUT"
mkdir -p "$OUT"
common=(--peers=4 --topology=ring --epochs=6 --rounds-per-epoch=25
    "--transport=$TRANSPORT" "--out=$OUT" "$@")
pids=()
RAYON_NUM_THREADS=1 "$MURMUR" peer --rank=0 "${common[@]}" --bootstrap-file="$OUT/boot.addr" \
    >"$OUT/peer-0.log" 2>&1 &
pids[0]=$!
until [ -s "$OUT/boot.addr" ]; do
    kill -0 "${pids[0]}" 2>/dev/null || { echo "peer 0 exited before it was listening:" >&2; tail -3 "$OUT/peer-0.log" >&2; exit 1; }
    sleep 0.05
done
for r in 1 2 3; do
    RAYON_NUM_THREADS=1 "$MURMUR" peer --rank=$r "${common[@]}" --bootstrap="$(cat "$OUT/boot.addr")" \
        >"$OUT/peer-$r.log" 2>&1 &
    pids[r]=$!
done
until grep -q '"epoch":1,' "$OUT/epochs.jsonl" 2>/dev/null; do sleep 0.05; done

t0=$(date +%s.%N)
if [ "$FAULT" = kill ]; then
    kill -KILL "${pids[VICTIM]}"
    echo "peer $VICTIM killed"
else
    kill -STOP "${pids[VICTIM]}"
    sleep "$SECS"
    kill -CONT "${pids[VICTIM]}"
    echo "peer $VICTIM stopped for $SECS s"
fi
for r in 0 1 2 3; do
    status=0
    wait "${pids[r]}" || status=$?
    [ "$FAULT" = kill ] && [ "$r" = "$VICTIM" ] && continue
    echo "peer $r exited with status $status"
done
echo "the peers ended $(echo "$(date +%s.%N) - $t0" | bc) s after the fault"
echo "membership.jsonl:"
cat "$OUT/membership.jsonl" 2>/dev/null || echo "(no departure)"
