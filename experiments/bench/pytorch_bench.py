#!/usr/bin/env python3
"""PyTorch companion of `murmur bench`: training throughput of the same three models.

Trains, on synthetic seeded data, the three architectures that `murmur bench` trains
(see experiments/bench/README.md for their exact definitions and parameter counts):

    mlp          784-256-10 MLP with ReLU                      d =   203,530
    resnet20     He et al. (2016) CIFAR ResNet-20, BatchNorm   d =   272,474
    transformer  decoder-only pre-norm LM, 2 layers, T = 128   d =   478,976

with torch.optim.SGD(lr=0.05, momentum=0.9), and reports, per model, the median time of
a training step (zero_grad + forward + loss + backward + optimizer.step()) and of a
forward + backward pass alone, and samples/s = batch_size / median step time.

One fixed batch is drawn once per model (torch.manual_seed) and placed on the device
before timing, so data generation and host-to-device copies are not measured.

    python3 experiments/bench/pytorch_bench.py --model all --batch-size 128
    python3 experiments/bench/pytorch_bench.py --model resnet20 --device cuda --json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from typing import Callable

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:  # pragma: no cover - depends on the environment
    sys.exit("pytorch_bench.py: PyTorch is not installed (pip install torch)")

MODELS = ("mlp", "resnet20", "transformer")

# Transformer hyper-parameters (shared with the Rust side; see README.md).
VOCAB = 256
CONTEXT = 128
D_MODEL = 128
HEADS = 4
LAYERS = 2
D_FF = 512

LR = 0.05
MOMENTUM = 0.9


# --------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------


# The modules' attribute names are murmur's field names, so that a run's
# model.safetensors loads into them with load_state_dict unchanged (evaluate_model.py).


class Mlp(nn.Module):
    """inputs-hidden-classes multilayer perceptron with ReLU (784-256-10 on MNIST, d =
    203,530; `mlp:hidden=N,input=CxHxW,classes=N` in murmur); input pixels / 255, flattened."""

    def __init__(self, hidden: int = 256, inputs: int = 784, classes: int = 10) -> None:
        super().__init__()
        self.fc1 = nn.Linear(inputs, hidden)
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


class Cnn(nn.Module):
    """murmur's small CNN (`cnn:input=CxHxW,classes=N`): conv3x3(C->16, padding 1), ReLU,
    maxpool 2x2, conv3x3(16->32, padding 1), ReLU, maxpool 2x2, Linear(32*(H//4)*(W//4) ->
    classes). d = 20,490 on MNIST (1x28x28), 25,578 on CIFAR-10 (3x32x32)."""

    def __init__(self, channels: int = 1, height: int = 28, width: int = 28, classes: int = 10):
        super().__init__()
        self.shape = (channels, height, width)
        self.conv1 = nn.Conv2d(channels, 16, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3, padding=1)
        self.fc = nn.Linear(32 * (height // 4) * (width // 4), classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(-1, *self.shape)
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def mlp() -> nn.Module:
    """See Mlp."""
    return Mlp()


class Shortcut(nn.Module):
    """conv1x1(stride) + BN: the shortcut of a block that changes width or resolution."""

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, kernel_size=1, stride=stride, bias=False)
        self.bn = nn.BatchNorm2d(c_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(x))


def conv3x3(c_in: int, c_out: int, stride: int = 1) -> nn.Conv2d:
    """3x3 convolution, padding 1, no bias (a BatchNorm follows)."""
    return nn.Conv2d(c_in, c_out, kernel_size=3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    """conv3x3-BN-ReLU-conv3x3-BN, plus the shortcut, then ReLU.

    The shortcut is the identity, or conv1x1(stride) + BN when the block changes the
    width or the resolution (ResNet "option B").
    """

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = conv3x3(c_in, c_out, stride)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = conv3x3(c_out, c_out)
        self.bn2 = nn.BatchNorm2d(c_out)
        if stride != 1 or c_in != c_out:
            self.shortcut: nn.Module = Shortcut(c_in, c_out, stride)
        else:
            self.shortcut = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class ResNet20(nn.Module):
    """CIFAR ResNet-20 (He et al. 2016, section 4.2), 3 stages x 3 BasicBlocks.

    Input [B, channels, H, W] (3x32x32 for CIFAR-10; the pooling is global); widths 16, 32,
    64; stages 2 and 3 start with stride 2.
    d = 272,474 (BatchNorm weight and bias counted, running statistics not).
    """

    def __init__(self, num_classes: int = 10, blocks_per_stage: int = 3, channels: int = 3):
        super().__init__()
        self.conv = conv3x3(channels, 16)
        self.bn = nn.BatchNorm2d(16)
        layers = []
        c_in = 16
        for i, width in enumerate((16, 32, 64)):
            for j in range(blocks_per_stage):
                stride = 2 if (i > 0 and j == 0) else 1
                layers.append(BasicBlock(c_in, width, stride))
                c_in = width
        self.blocks = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn(self.conv(x)))
        x = self.blocks(x)
        x = self.pool(x).flatten(1)
        return self.fc(x)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention, explicit implementation.

    Separate q, k, v and output projections, each nn.Linear(d_model, d_model) with bias
    (the same 4 * (d_model^2 + d_model) parameters as nn.MultiheadAttention).
    `kernel` selects F.scaled_dot_product_attention(is_causal=True) ("sdpa", PyTorch's
    fused kernel) or the textbook softmax(QK^T / sqrt(d_head) + mask) V ("naive").
    """

    def __init__(self, d_model: int, heads: int, kernel: str = "sdpa") -> None:
        super().__init__()
        assert d_model % heads == 0
        self.heads = heads
        self.kernel = kernel
        self.query = nn.Linear(d_model, d_model)
        self.key = nn.Linear(d_model, d_model)
        self.value = nn.Linear(d_model, d_model)
        self.output = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        h = self.heads

        def split(y: torch.Tensor) -> torch.Tensor:
            return y.view(b, t, h, c // h).transpose(1, 2)  # [B, H, T, C/H]

        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        if self.kernel == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(c // h)
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            scores = scores.masked_fill(mask, float("-inf"))
            y = scores.softmax(dim=-1) @ v
        return self.output(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    """Pre-norm decoder block: x + attn(LN(x)), then x + MLP(LN(x)), GELU, dropout 0."""

    def __init__(self, d_model: int, heads: int, d_ff: int, kernel: str) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, heads, kernel)
        self.ln_2 = nn.LayerNorm(d_model)
        self.mlp = FeedForward(d_model, d_ff)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class FeedForward(nn.Module):
    """Linear(d_model, d_ff), GELU, Linear(d_ff, d_model)."""

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d_model, d_ff)
        self.proj = nn.Linear(d_ff, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class TransformerLM(nn.Module):
    """Decoder-only byte-level LM: token + learned position embedding, 2 pre-norm
    blocks, final LayerNorm, untied Linear head (d = 478,976)."""

    def __init__(
        self,
        kernel: str = "sdpa",
        vocab: int = VOCAB,
        context: int = CONTEXT,
        d_model: int = D_MODEL,
        heads: int = HEADS,
        layers: int = LAYERS,
        d_ff: int = D_FF,
    ) -> None:
        super().__init__()
        self.token_embedding = nn.Embedding(vocab, d_model)
        self.position_embedding = nn.Parameter(torch.randn(context, d_model) * 0.02)
        self.blocks = nn.Sequential(*[Block(d_model, heads, d_ff, kernel) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        x = self.token_embedding(tokens) + self.position_embedding[:t]
        return self.head(self.ln_f(self.blocks(x)))  # [B, T, VOCAB]


def parameter_count(model: nn.Module) -> int:
    """Number of trainable parameters d."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


# --------------------------------------------------------------------------------------
# Synthetic data and loss
# --------------------------------------------------------------------------------------


def build(name: str, batch_size: int, device: torch.device, attention: str):
    """Model, one synthetic batch (inputs, targets) on `device`, and the loss function.

    The loss maps (model output, targets) to a scalar mean cross-entropy.
    """
    g = torch.Generator().manual_seed(0)
    if name == "mlp":
        model: nn.Module = mlp()
        x = torch.rand(batch_size, 784, generator=g)
        y = torch.randint(0, 10, (batch_size,), generator=g)
        loss_fn: Callable = F.cross_entropy
    elif name == "resnet20":
        model = ResNet20()
        x = torch.rand(batch_size, 3, 32, 32, generator=g)
        y = torch.randint(0, 10, (batch_size,), generator=g)
        loss_fn = F.cross_entropy
    elif name == "transformer":
        model = TransformerLM(attention)
        seq = torch.randint(0, VOCAB, (batch_size, CONTEXT + 1), generator=g)
        x, y = seq[:, :-1].contiguous(), seq[:, 1:].contiguous()

        def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            """Mean next-token cross-entropy over all B*T positions."""
            return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))

    else:
        raise ValueError(f"unknown model {name!r}")
    return model.to(device).train(), x.to(device), y.to(device), loss_fn


# --------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------


def sync(device: torch.device) -> None:
    """Wait for queued kernels (CUDA); no-op on CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_loop(fn: Callable[[], None], steps: int, warmup: int, device: torch.device) -> list:
    """Run `fn` `warmup` times untimed, then `steps` times; wall time of each, in ms."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        fn()
        sync(device)
        times.append((time.perf_counter() - start) * 1e3)
    return times


def bench_model(name: str, args: argparse.Namespace, device: torch.device) -> dict:
    """Benchmark one model; returns the result record (see README.md for the fields)."""
    torch.manual_seed(args.seed)
    model, x, y, loss_fn = build(name, args.batch_size, device, args.attention)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    losses = []

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss)

    def fwd_bwd() -> None:
        loss = loss_fn(model(x), y)
        loss.backward()

    step_ms = time_loop(step, args.steps, args.warmup, device)
    # Gradients of fwd_bwd accumulate into .grad (as after a step's backward); they are
    # cleared once here, outside the timed region.
    opt.zero_grad(set_to_none=True)
    fwd_bwd_ms = time_loop(fwd_bwd, args.steps, args.warmup, device)

    step_median = statistics.median(step_ms)
    return {
        "framework": "pytorch",
        "model": name,
        "d": parameter_count(model),
        "batch_size": args.batch_size,
        "device": str(device),
        "device_name": device_name(device),
        "torch_version": torch.__version__,
        "threads": torch.get_num_threads(),
        "attention": args.attention if name == "transformer" else None,
        "samples_per_second": args.batch_size / (step_median / 1e3),
        "step_ms_median": step_median,
        "step_ms_mean": statistics.fmean(step_ms),
        "step_ms_min": min(step_ms),
        "fwd_bwd_ms_median": statistics.median(fwd_bwd_ms),
        "steps": args.steps,
        "warmup": args.warmup,
        "first_loss": losses[0].item(),
        "last_loss": losses[-1].item(),
        # 1-minute load average after the run: a value above the thread count means the
        # CPU was shared with other work and the times are inflated.
        "load_average_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }


# --------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------


def device_name(device: torch.device) -> str:
    """Human-readable name of the device (GPU model on CUDA)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return "cpu"


def resolve_device(spec: str) -> torch.device:
    """Parse `cpu`, `cuda` or `cuda:N`; exit with a clear message if CUDA is unusable."""
    try:
        device = torch.device(spec)
    except RuntimeError as e:
        sys.exit(f"pytorch_bench.py: invalid --device {spec!r}: {e}")
    if device.type == "cpu":
        return device
    if device.type != "cuda":
        sys.exit(f"pytorch_bench.py: --device must be cpu, cuda or cuda:N, not {spec!r}")
    if not torch.cuda.is_available():
        sys.exit(
            f"pytorch_bench.py: --device {spec} requested but CUDA is not available "
            f"(torch {torch.__version__}, built with CUDA {torch.version.cuda}); "
            "use --device cpu"
        )
    index = device.index if device.index is not None else 0
    if index >= torch.cuda.device_count():
        sys.exit(
            f"pytorch_bench.py: --device {spec}: only {torch.cuda.device_count()} "
            "CUDA device(s) visible"
        )
    return torch.device("cuda", index)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="PyTorch training throughput of murmur's bench models "
        "(samples/s; SGD lr 0.05, momentum 0.9; synthetic seeded data).",
    )
    p.add_argument("--model", choices=MODELS + ("all",), default="all")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--steps", type=int, default=20, help="timed steps (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    p.add_argument(
        "--device", default="cpu",
        help="cpu, cuda or cuda:N (default cpu); libtorch, murmur's CPU device through "
        "PyTorch's C++ library, is PyTorch's cpu here",
    )
    p.add_argument(
        "--threads", type=int, default=None,
        help="torch.set_num_threads (default: PyTorch's choice)",
    )
    p.add_argument(
        "--attention", choices=("sdpa", "naive"), default="sdpa",
        help="transformer attention kernel: F.scaled_dot_product_attention (default) "
        "or explicit matmul-mask-softmax-matmul",
    )
    p.add_argument("--seed", type=int, default=0, help="torch.manual_seed (default 0)")
    p.add_argument("--json", action="store_true", help="one JSON object per model per line")
    args = p.parse_args(argv)
    if args.batch_size < 1 or args.steps < 1 or args.warmup < 0:
        p.error("--batch-size and --steps must be >= 1, --warmup >= 0")
    if args.threads is not None and args.threads < 1:
        p.error("--threads must be >= 1")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    device = resolve_device("cpu" if args.device == "libtorch" else args.device)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    names = MODELS if args.model == "all" else (args.model,)
    if not args.json:
        print(
            f"torch {torch.__version__}, device {device} ({device_name(device)}), "
            f"threads {torch.get_num_threads()}, batch {args.batch_size}, "
            f"{args.warmup} warm-up + {args.steps} timed steps"
        )
        print(f"{'model':<12} {'d':>9} {'samples/s':>11} {'step ms':>9} {'fwd+bwd ms':>11}")
    for name in names:
        r = bench_model(name, args, device)
        if args.json:
            print(json.dumps(r), flush=True)
        else:
            print(
                f"{r['model']:<12} {r['d']:>9,} {r['samples_per_second']:>11.1f} "
                f"{r['step_ms_median']:>9.2f} {r['fwd_bwd_ms_median']:>11.2f}",
                flush=True,
            )
    if not args.json and hasattr(os, "getloadavg"):
        print(f"1-minute load average after the run: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
