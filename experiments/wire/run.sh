#!/usr/bin/env bash
# The wire's anchors and murmur in one run, on loopback: iperf3 (kernel TCP, one stream,
# 1 MiB writes), PyTorch gloo send/recv (gloo_sendrecv.py), OpenSSL's TLS 1.3 over TCP
# (openssl_tls.py), then `murmur netbench --baselines` (murmur's QUIC, TCP with TLS, TCP in
# clear and shared memory, and its own TCP, TLS-over-TCP and memcpy baselines), all moving
# 100 MB messages.
#
#   experiments/wire/run.sh OUT
#
# The tools take turns: each of ROUNDS rounds runs every tool once, one measurement of MB
# megabytes each, so a tool and the anchor it is judged against are measured minutes apart
# at most, whatever the machine does meanwhile. The ratios (murmur's TCP in clear / gloo and
# / iperf3, murmur's TCP with TLS / OpenSSL's, CPU per byte against a TCP socket's) are taken
# within each round; the table prints each tool's median over the rounds, then every
# round's ratios and their median.
#
# Environment: MURMUR (binary; default target/release/murmur), PYTHON (a Python with torch;
# default python3 — gloo is skipped without torch), MB (megabytes per measurement, 1000),
# ROUNDS (3; REPEAT is read as ROUNDS too). Writes OUT/<round>/{iperf3,gloo,openssl,
# netbench}.json and OUT/summary.json (the medians and the ratios per round).
set -euo pipefail
OUT=${1:?usage: run.sh OUT}
MURMUR=${MURMUR:-target/release/murmur}
PYTHON=${PYTHON:-python3}
MB=${MB:-1000}
ROUNDS=${ROUNDS:-${REPEAT:-3}}
HERE=$(dirname "$(realpath "$0")")
mkdir -p "$OUT"
command -v iperf3 >/dev/null || { echo "run.sh: needs iperf3 (apt-get install iperf3)" >&2; exit 1; }
gloo=1
"$PYTHON" -c "import torch" 2>/dev/null || { gloo=0; echo "run.sh: $PYTHON has no torch: PyTorch gloo skipped" >&2; }

for k in $(seq 1 "$ROUNDS"); do
    mkdir -p "$OUT/$k"
    iperf3 -s -1 -p 5299 >/dev/null 2>&1 &
    server=$!
    sleep 0.3
    iperf3 -c 127.0.0.1 -p 5299 -n "${MB}M" -l 1M -J >"$OUT/$k/iperf3.json"
    wait "$server" || true
    if [ "$gloo" = 1 ]; then
        "$PYTHON" "$HERE/gloo_sendrecv.py" --bytes 100000000 --messages $((MB / 100)) \
            --repeat 1 >"$OUT/$k/gloo.json"
    fi
    python3 "$HERE/openssl_tls.py" --bytes 100000000 --messages $((MB / 100)) \
        --repeat 1 >"$OUT/$k/openssl.json"
    "$MURMUR" netbench --baselines --link tcp-plaintext --megabytes "$MB" \
        --frame-bytes 100000000 --repeat 1 --json >"$OUT/$k/netbench.json"
    echo "run.sh: round $k of $ROUNDS done" >&2
done

python3 - "$OUT" "$ROUNDS" <<'PY'
import json, os, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
names = {"iperf3": "iperf3 (kernel TCP, 1 MiB writes)", "gloo": "PyTorch gloo send/recv",
         "openssl": "OpenSSL TLS 1.3", "murmur_tcp_plaintext": "murmur TCP (plaintext)",
         "murmur": "murmur QUIC", "murmur_tcp": "murmur TCP (TLS)",
         "murmur_shm": "murmur shared memory", "tls_tcp": "rustls TLS 1.3 over TCP",
         "tcp": "TCP (Rust threads)", "memcpy": "memcpy"}

def load(k):
    """One round: {tool: (MB/s, CPU-seconds per GB)}."""
    d = os.path.join(out, str(k))
    r = {}
    e = json.load(open(f"{d}/iperf3.json"))["end"]
    s = e["sum_received"]
    c = e["cpu_utilization_percent"]
    r["iperf3"] = (s["bits_per_second"] / 8e6,
                   (c["host_total"] + c["remote_total"]) / 100 * s["seconds"] / (s["bytes"] / 1e9))
    for tool in ("gloo", "openssl"):
        try:
            j = json.load(open(f"{d}/{tool}.json"))
            r[tool] = (j["mb_per_s"], j["cpu_seconds_per_gb"])
        except (OSError, ValueError):
            pass
    for t in json.load(open(f"{d}/netbench.json"))["transports"]:
        r[t["transport"]] = (t["bytes_per_second"] / 1e6, t["cpu_seconds_per_gb"])
    return r

per_round = [load(k) for k in range(1, rounds + 1)]
tools = [t for t in names if all(t in r for r in per_round)]
print(f"{'one 100 MB message, loopback':<36} {'MB/s':>9} {'CPU s/GB':>9}   (medians of {rounds} rounds)")
medians = {}
for t in tools:
    mbs = statistics.median(r[t][0] for r in per_round)
    cpu = statistics.median(r[t][1] for r in per_round)
    medians[t] = {"mb_per_s": mbs, "cpu_seconds_per_gb": cpu}
    print(f"{names[t]:<36} {mbs:>9.1f} {cpu:>9.2f}")

# (label, numerator, denominator, of rate (0) or of CPU per byte (1))
pairs = [("TCP plaintext / gloo, MB/s", "murmur_tcp_plaintext", "gloo", 0),
         ("TCP plaintext / iperf3, MB/s", "murmur_tcp_plaintext", "iperf3", 0),
         ("TCP TLS / OpenSSL, MB/s", "murmur_tcp", "openssl", 0),
         ("TCP plaintext / Rust TCP, CPU per byte", "murmur_tcp_plaintext", "tcp", 1),
         ("TCP plaintext / iperf3, CPU per byte", "murmur_tcp_plaintext", "iperf3", 1),
         ("QUIC, CPU-seconds per GB", "murmur", None, 1)]
ratios = {}
print()
print(f"{'within each round':<40} " + " ".join(f"{k:>7}" for k in range(1, rounds + 1)) + f" {'median':>7}")
for label, a, b, i in pairs:
    if a not in tools or (b is not None and b not in tools):
        continue
    xs = [r[a][i] / (r[b][i] if b else 1.0) for r in per_round]
    ratios[label] = xs
    print(f"{label:<40} " + " ".join(f"{x:>7.2f}" for x in xs) + f" {statistics.median(xs):>7.2f}")
json.dump({"rounds": rounds, "medians": medians, "ratios": ratios,
           "per_round": per_round}, open(os.path.join(out, "summary.json"), "w"), indent=1)
PY
