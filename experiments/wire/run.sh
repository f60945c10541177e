#!/usr/bin/env bash
# The wire's anchors and murmur in one run, on loopback: iperf3 (kernel TCP, one stream,
# 1 MiB writes), PyTorch gloo send/recv (gloo_sendrecv.py), OpenSSL's TLS 1.3 over TCP
# (openssl_tls.py), then `murmur netbench
# --baselines` (murmur's QUIC, TCP with TLS, TCP in clear and shared memory, and its own TCP,
# TLS-over-TCP and memcpy baselines), all moving 100 MB messages, REPEAT times each.
#
#   experiments/wire/run.sh OUT
#
# Environment: MURMUR (binary; default target/release/murmur), PYTHON (a Python with torch;
# default python3 — gloo is skipped without torch), MB (megabytes per measurement, 1000),
# REPEAT (3). Writes OUT/iperf3-<k>.json, OUT/gloo.json, OUT/openssl.json,
# OUT/netbench.json and prints one
# table: MB/s and CPU-seconds per GB (both ends) of each.
set -euo pipefail
OUT=${1:?usage: run.sh OUT}
MURMUR=${MURMUR:-target/release/murmur}
PYTHON=${PYTHON:-python3}
MB=${MB:-1000}
REPEAT=${REPEAT:-3}
HERE=$(dirname "$(realpath "$0")")
mkdir -p "$OUT"
command -v iperf3 >/dev/null || { echo "run.sh: needs iperf3 (apt-get install iperf3)" >&2; exit 1; }

for k in $(seq 1 "$REPEAT"); do
    iperf3 -s -1 -p 5299 >/dev/null 2>&1 &
    server=$!
    sleep 0.3
    iperf3 -c 127.0.0.1 -p 5299 -n "${MB}M" -l 1M -J >"$OUT/iperf3-$k.json"
    wait "$server" || true
done
if "$PYTHON" -c "import torch" 2>/dev/null; then
    "$PYTHON" "$HERE/gloo_sendrecv.py" --bytes 100000000 --messages $((MB / 100)) \
        --repeat "$REPEAT" >"$OUT/gloo.json"
else
    echo "run.sh: $PYTHON has no torch: PyTorch gloo skipped" >&2
fi
python3 "$HERE/openssl_tls.py" --bytes 100000000 --messages $((MB / 100)) \
    --repeat "$REPEAT" >"$OUT/openssl.json"
"$MURMUR" netbench --baselines --link tcp-plaintext --megabytes "$MB" \
    --frame-bytes 100000000 --repeat "$REPEAT" --json >"$OUT/netbench.json"

python3 - "$OUT" <<'PY'
import glob, json, statistics, sys
out = sys.argv[1]
rows = []
ip = [json.load(open(f)) for f in sorted(glob.glob(f"{out}/iperf3-*.json"))]
rate = statistics.median(r["end"]["sum_received"]["bits_per_second"] / 8e6 for r in ip)
def cpu(r):
    e = r["end"]
    seconds = e["sum_received"]["seconds"]
    gb = e["sum_received"]["bytes"] / 1e9
    c = e["cpu_utilization_percent"]
    return (c["host_total"] + c["remote_total"]) / 100 * seconds / gb
rows.append(("iperf3 (kernel TCP, 1 MiB writes)", rate, statistics.median(map(cpu, ip))))
try:
    g = json.load(open(f"{out}/gloo.json"))
    rows.append((f"PyTorch {g['torch']} gloo send/recv", g["mb_per_s"], g["cpu_seconds_per_gb"]))
except (OSError, ValueError):
    pass
o = json.load(open(f"{out}/openssl.json"))
rows.append((f"OpenSSL {o['tls']} ({o['cipher']})", o["mb_per_s"], o["cpu_seconds_per_gb"]))
names = {"murmur": "murmur QUIC", "murmur_tcp": "murmur TCP (TLS)",
         "murmur_tcp_plaintext": "murmur TCP (plaintext)", "murmur_shm": "murmur shared memory",
         "tls_tcp": "rustls TLS 1.3 over TCP", "tcp": "TCP (Rust threads)", "memcpy": "memcpy"}
for t in json.load(open(f"{out}/netbench.json"))["transports"]:
    rows.append((names.get(t["transport"], t["transport"]), t["bytes_per_second"] / 1e6,
                 t["cpu_seconds_per_gb"]))
print(f"{'one 100 MB message, loopback':<36} {'MB/s':>9} {'CPU s/GB':>9}")
for name, mbs, c in rows:
    print(f"{name:<36} {mbs:>9.1f} {c:>9.2f}")
PY
