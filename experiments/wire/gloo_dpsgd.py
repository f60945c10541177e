#!/usr/bin/env python3
"""D-PSGD on a ring in PyTorch over gloo: the round time a PyTorch user gets on the same
links as a murmur run (`experiments/cluster/netns-ring.sh` with `BASELINE=gloo`).

One process per peer. Each round: one SGD step (lr 0.05, momentum 0.9, as
`pytorch_bench.py`) of the MLP 784-hidden-10 on one fixed synthetic batch, and one gossip
exchange with both ring neighbours: x_i is flattened (`parameters_to_vector`), sent with
`dist.isend` and the neighbours' received with `dist.irecv` (gloo: plain TCP), then
x_i ← Σ_j w_ij x_j with Metropolis–Hastings weights on the ring (1/3 each; 1/2 each for 2
peers, whose two neighbours are one peer).

- `--overlap off` (the default, what a PyTorch user writes): step, then exchange, then mix.
- `--overlap on`: the exchange of x_t is posted first and the gradient at x_t is computed
  while it travels; then x_{t+1} = mix(x_t) − the optimizer's step (murmur's D-PSGD order).

Prints one JSON line per peer: the mean and median round time in seconds, leaving out the
first `--skip` rounds (connections, allocation), and with `--overlap off` the mean time of
the exchange alone (posted to all done). Needs PyTorch (a venv outside the repo).

    python3 gloo_dpsgd.py --rank R --peers N --master-addr 10.78.0.1 --hidden 31447
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.utils import parameters_to_vector, vector_to_parameters

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
from pytorch_bench import Mlp  # noqa: E402  (the same model as murmur's mlp:hidden=N)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--peers", type=int, required=True)
    ap.add_argument("--master-addr", required=True, help="peer 0's address")
    ap.add_argument("--port", type=int, default=29500)
    ap.add_argument("--hidden", type=int, default=256, help="MLP width (murmur's mlp:hidden=N)")
    ap.add_argument("--rounds", type=int, default=24)
    ap.add_argument("--skip", type=int, default=2, help="first rounds left out of the times")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--overlap", choices=("off", "on"), default="off")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    a = ap.parse_args()
    if a.peers < 2 or not 0 <= a.rank < a.peers or a.rounds <= a.skip:
        ap.error("need --peers >= 2, 0 <= --rank < --peers and --rounds > --skip")
    if a.threads:
        torch.set_num_threads(a.threads)
    os.environ["MASTER_ADDR"] = a.master_addr
    os.environ["MASTER_PORT"] = str(a.port)
    dist.init_process_group("gloo", rank=a.rank, world_size=a.peers)

    torch.manual_seed(0)  # every peer starts from the same x0
    model = Mlp(a.hidden)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(1 + a.rank)
    x_batch = torch.rand(a.batch_size, 784, generator=gen)
    y_batch = torch.randint(0, 10, (a.batch_size,), generator=gen)
    neighbours = sorted({(a.rank + 1) % a.peers, (a.rank - 1) % a.peers})
    w = 1.0 / (len(neighbours) + 1)  # Metropolis–Hastings on a ring (all degrees equal)
    params = list(model.parameters())
    inbox = {j: torch.empty_like(parameters_to_vector(params)) for j in neighbours}

    def gradient() -> None:
        opt.zero_grad(set_to_none=False)
        F.cross_entropy(model(x_batch), y_batch).backward()

    def post(x: torch.Tensor) -> list:
        works = [dist.isend(x, j) for j in neighbours]
        works += [dist.irecv(inbox[j], j) for j in neighbours]
        return works

    def mixed(x: torch.Tensor) -> torch.Tensor:
        out = x * w
        for j in neighbours:
            out.add_(inbox[j], alpha=w)
        return out

    times, exchange = [], []
    dist.barrier()
    for _ in range(a.rounds):
        t0 = time.perf_counter()
        if a.overlap == "off":
            gradient()
            opt.step()
            x = parameters_to_vector(params).detach()  # a new tensor (a copy)
            t1 = time.perf_counter()
            for work in post(x):
                work.wait()
            exchange.append(time.perf_counter() - t1)
            vector_to_parameters(mixed(x), params)
        else:
            x = parameters_to_vector(params).detach()
            works = post(x)
            gradient()  # at x_t, while x_t travels
            for work in works:
                work.wait()
            with torch.no_grad():
                vector_to_parameters(mixed(x), params)
            opt.step()  # x_{t+1} = mix(x_t) − step(g(x_t))
        times.append(time.perf_counter() - t0)
    dist.barrier()
    kept = times[a.skip:]
    print(json.dumps({
        "framework": "pytorch-gloo",
        "rank": a.rank,
        "peers": a.peers,
        "overlap": a.overlap,
        "d": sum(p.numel() for p in params),
        "message_bytes": 4 * sum(p.numel() for p in params),
        "rounds_timed": len(kept),
        "round_seconds_mean": statistics.mean(kept),
        "round_seconds_median": statistics.median(kept),
        # --overlap off: from posting the sends and receives until all are done.
        "exchange_seconds_mean": statistics.mean(exchange[a.skip:]) if exchange else None,
        "torch_version": torch.__version__,
        "threads": torch.get_num_threads(),
    }), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
