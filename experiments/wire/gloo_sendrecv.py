#!/usr/bin/env python3
"""PyTorch gloo's point-to-point throughput, the anchor of `murmur netbench`'s TCP rows.

Two processes on this machine (rank 0 sends, rank 1 receives) move `--messages` messages of
`--bytes` bytes with `torch.distributed.send`/`recv` over gloo (unencrypted TCP, the wire a
PyTorch user of decentralized training has), into one preallocated tensor as a PyTorch
user would. Prints one JSON object: MB/s (10^6 bytes per second, the median of `--repeat`
timed passes after one warm-up message) and CPU-seconds per 10^9 bytes (user + system of
both processes over the timed passes).

    python3 gloo_sendrecv.py --bytes 100000000 --messages 10 --repeat 3

Needs PyTorch (`pip install torch` in a virtual environment outside the repository); not
part of the test suite.
"""
import argparse
import json
import os
import resource
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def cpu():
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def run(rank, args, port, out):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    buf = torch.zeros(args.bytes, dtype=torch.uint8)
    if rank == 0:
        buf.fill_(0xA5)
    # One warm-up message: connections are made lazily.
    (dist.send if rank == 0 else dist.recv)(buf, 1 - rank)
    rates, cpus = [], []
    for _ in range(args.repeat):
        dist.barrier()
        c, t = cpu(), time.perf_counter()
        for _ in range(args.messages):
            (dist.send if rank == 0 else dist.recv)(buf, 1 - rank)
        if rank == 1:
            # The receiver's clock: the last byte has arrived.
            rates.append(args.bytes * args.messages / (time.perf_counter() - t))
        cpus.append(cpu() - c)
        dist.barrier()
    out[rank] = (rates, cpus)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bytes", type=int, default=100_000_000)
    p.add_argument("--messages", type=int, default=10)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--port", type=int, default=29517)
    args = p.parse_args()
    torch.set_num_threads(1)
    with mp.Manager() as m:
        out = m.dict()
        mp.spawn(run, args=(args, args.port, out), nprocs=2, join=True)
        rates, cpu_recv = out[1]
        _, cpu_send = out[0]
    moved = args.bytes * args.messages
    cpu_per_gb = [(a + b) * 1e9 / moved for a, b in zip(cpu_send, cpu_recv)]
    print(json.dumps({
        "transport": "pytorch_gloo",
        "torch": torch.__version__,
        "bytes": args.bytes,
        "messages": args.messages,
        "mb_per_s": statistics.median(rates) / 1e6,
        "cpu_seconds_per_gb": statistics.median(cpu_per_gb),
        "passes": args.repeat,
    }))


if __name__ == "__main__":
    main()
