#!/usr/bin/env python3
"""The PyTorch side of node/benches/flex_upstream.rs: the same three cases on the CPU, for the
upstream report in experiments/bench/burn-upstream.md.

    python3 experiments/bench/flex_upstream.py          # torch.set_num_threads(2)

Prints the median of 15 timed runs (after 2 untimed ones) of each case, in milliseconds.
"""

import statistics
import time

import torch

torch.set_num_threads(2)
B, C, H, W = 32, 16, 32, 32
RUNS = 15


def median_ms(f) -> float:
    for _ in range(2):
        f()
    times = []
    for _ in range(RUNS):
        t = time.perf_counter()
        f()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


x = torch.rand(B, C, H, W)
s = torch.rand(C)
print(f"PyTorch {torch.__version__}, {torch.get_num_threads()} threads, x: [{B}, {C}, {H}, {W}]; median of {RUNS} runs")

s4 = s.reshape(1, C, 1, 1)
broadcast = median_ms(lambda: x * s4)
s3 = s.reshape(1, C, 1).repeat(B, 1, 1)
rows = median_ms(lambda: x.reshape(B, C, H * W) * s3)
print(f"1. x * s[1,C,1,1]: {broadcast:.2f} ms; as x[B,C,HW] * s[B,C,1]: {rows:.2f} ms ({broadcast / rows:.1f}x)")

bn = torch.nn.BatchNorm2d(C).train()
xa = torch.rand(B, C, H, W, requires_grad=True)


def bn_step() -> None:
    xa.grad = None
    bn(xa).sum().backward()


print(f"2. BatchNorm2d({C}) forward + backward: {median_ms(bn_step):.2f} ms")

conv = torch.nn.Conv2d(C, C, 3, padding=1, bias=False)
with torch.no_grad():
    forward = median_ms(lambda: conv(x))


def conv_step() -> None:
    xa.grad = None
    conv.weight.grad = None
    conv(xa).sum().backward()


print(f"3. Conv2d({C}->{C}, 3x3, padding 1) forward: {forward:.2f} ms; forward + backward: {median_ms(conv_step):.2f} ms")
