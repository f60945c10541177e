#!/usr/bin/env python3
"""OpenSSL's TLS 1.3 over loopback TCP (Python's ssl module), the anchor of murmur's
encrypted TCP link.

A sending and a receiving process move `--messages` messages of `--bytes` bytes over one TLS
1.3 connection (AES-128-GCM, a self-signed certificate made with the `openssl` command),
the receiver reading into one preallocated buffer. Prints one JSON object: MB/s (the median
of `--repeat` timed passes, receiver's clock) and CPU-seconds per 10^9 bytes (both
processes). Not part of the test suite.

    python3 openssl_tls.py --bytes 100000000 --messages 10 --repeat 3
"""
import argparse
import json
import multiprocessing as mp
import os
import resource
import socket
import ssl
import statistics
import subprocess
import tempfile
import time


def cpu():
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def receiver(args, cert, key, port_q, out_q):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.load_cert_chain(cert, key)
    with socket.create_server(("127.0.0.1", 0)) as srv:
        port_q.put(srv.getsockname()[1])
        conn, _ = srv.accept()
        with ctx.wrap_socket(conn, server_side=True) as s:
            buf = bytearray(args.bytes)
            view = memoryview(buf)
            results = []
            for _ in range(args.repeat):
                c, t = cpu(), time.perf_counter()
                for _ in range(args.messages):
                    got = 0
                    while got < args.bytes:
                        n = s.recv_into(view[got:], args.bytes - got)
                        if n == 0:
                            raise EOFError("the sender closed early")
                        got += n
                results.append((args.bytes * args.messages / (time.perf_counter() - t), cpu() - c))
                s.sendall(b"k")  # the pass is done: the sender's CPU figure ends here too
            out_q.put(("recv", results, s.version(), s.cipher()[0]))


def sender(args, port, out_q):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port)) as tcp, ctx.wrap_socket(tcp) as s:
        msg = bytes([0xA5]) * args.bytes
        cpus = []
        for _ in range(args.repeat):
            c = cpu()
            for _ in range(args.messages):
                s.sendall(msg)
            s.recv(1)
            cpus.append(cpu() - c)
        out_q.put(("send", cpus))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bytes", type=int, default=100_000_000)
    p.add_argument("--messages", type=int, default=10)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d:
        cert, key = os.path.join(d, "c.pem"), os.path.join(d, "k.pem")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                        "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", key, "-out", cert,
                        "-days", "1", "-subj", "/CN=localhost"], check=True,
                       capture_output=True)
        port_q, out_q = mp.Queue(), mp.Queue()
        r = mp.Process(target=receiver, args=(args, cert, key, port_q, out_q))
        r.start()
        s = mp.Process(target=sender, args=(args, port_q.get(timeout=30), out_q))
        s.start()
        got = dict((m[0], m[1:]) for m in (out_q.get(timeout=600), out_q.get(timeout=600)))
        r.join()
        s.join()
    results, version, cipher = got["recv"]
    moved = args.bytes * args.messages
    print(json.dumps({
        "transport": "openssl_tls",
        "openssl": ssl.OPENSSL_VERSION,
        "tls": version,
        "cipher": cipher,
        "bytes": args.bytes,
        "messages": args.messages,
        "mb_per_s": statistics.median(r[0] for r in results) / 1e6,
        "cpu_seconds_per_gb": statistics.median(
            (rc + sc) * 1e9 / moved for (_, rc), sc in zip(results, got["send"][0])),
        "passes": args.repeat,
    }))


if __name__ == "__main__":
    main()
