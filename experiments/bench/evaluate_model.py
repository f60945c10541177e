#!/usr/bin/env python3
"""Evaluate a run's model.safetensors outside murmur, in PyTorch, and compare with the run.

Loads <run>/model.safetensors into the reference PyTorch model of pytorch_bench.py (whose
attribute names are murmur's field names) with load_state_dict, evaluates it on the run's
test set, and prints its accuracy beside the x̄ accuracy the run recorded
(summary.json: final_avg_model_test_accuracy). Exits 1 if they differ by more than
--tolerance percentage points.

    python3 experiments/bench/evaluate_model.py runs/<run-id>
    python3 experiments/bench/evaluate_model.py runs/<run-id> --data /data/cifar-10-batches-bin
    python3 experiments/bench/evaluate_model.py runs/<run-id> --peer 3   # --save-peer-models

With --peer R it evaluates peer R's own model (<run>/peers/model-R.safetensors, written with
--save-peer-models) against the accuracy peer R recorded for its last epoch
(<run>/peers/peer-R.jsonl).

The test set is the run's: `data` of <run>/run.toml (or --data: MNIST's t10k files or
CIFAR-10's test_batch.bin; image folders are not read here), else for mlp and cnn the 2,000
MNIST test digits embedded in murmur (node/data/mnist/t10k-*.gz), for the transformer the
256 validation sequences of the embedded King James Bible, of a byte-level text, of a
token file (llm.c header or none) or of a folder's validation token files (the accuracy is
next-token accuracy over every position, and the mean cross-entropy is printed beside the
run's). Preprocessing is
murmur's: MNIST pixels / 255; CIFAR-10 pixels / 255, then per channel
(v - mean) / std with mean (0.4914, 0.4822, 0.4465) and std (0.2470, 0.2435, 0.2616).
ResNet-20 is evaluated with the BatchNorm statistics in the file (the peers' mean).

Needs torch and safetensors (pip install torch safetensors); kept out of the test suite.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import tomllib

import numpy as np

try:
    import torch
    from safetensors.torch import load_file
except ImportError:  # pragma: no cover - depends on the environment
    sys.exit("evaluate_model.py: needs torch and safetensors (pip install torch safetensors)")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pytorch_bench as ref  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CIFAR_MEAN = np.array([0.4914, 0.4822, 0.4465], dtype=np.float32)
CIFAR_STD = np.array([0.2470, 0.2435, 0.2616], dtype=np.float32)


def read_idx(path: str) -> np.ndarray:
    """An IDX file (gzipped or not) as an array of its dimensions."""
    raw = open(path, "rb").read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    dims = raw[3]
    shape = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def mnist_test(data: str | None) -> tuple[np.ndarray, np.ndarray]:
    """MNIST test images [n, rows * cols] in [0, 1] and labels [n]."""
    folder = data or os.path.join(ROOT, "node", "data", "mnist")

    def find(base: str) -> str:
        for name in (base, base + ".gz"):
            if os.path.exists(os.path.join(folder, name)):
                return os.path.join(folder, name)
        sys.exit(f"evaluate_model.py: {base} not found in {folder}")

    images = read_idx(find("t10k-images-idx3-ubyte"))
    images = images.reshape(len(images), -1) / np.float32(255)
    return images.astype(np.float32), read_idx(find("t10k-labels-idx1-ubyte")).astype(np.int64)


def cifar_test(data: str) -> tuple[np.ndarray, np.ndarray]:
    """CIFAR-10 test images [n, 3, 32, 32], normalised, and labels [n]."""
    for folder in (data, os.path.join(data, "cifar-10-batches-bin")):
        path = os.path.join(folder, "test_batch.bin")
        if os.path.exists(path):
            records = np.fromfile(path, dtype=np.uint8).reshape(-1, 3073)
            images = records[:, 1:].reshape(-1, 3, 32, 32).astype(np.float32) / 255
            images = (images - CIFAR_MEAN[:, None, None]) / CIFAR_STD[:, None, None]
            return images.astype(np.float32), records[:, 0].astype(np.int64)
    sys.exit(f"evaluate_model.py: no test_batch.bin in {data}")


def image_sizes(kind: str) -> dict:
    """The sizes of `mlp|cnn|resnet20[:hidden=N,input=CxHxW,classes=N]` (the family's
    defaults for the others: MNIST's 1x28x28 for mlp and cnn, CIFAR-10's 3x32x32 for
    resnet20)."""
    name = kind.split(":")[0]
    shape = (3, 32, 32) if name == "resnet20" else (1, 28, 28)
    sizes = {"hidden": 256, "input": shape, "classes": 10}
    if ":" in kind:
        for pair in kind.split(":", 1)[1].split(","):
            key, value = pair.split("=")
            sizes[key] = tuple(int(v) for v in value.split("x")) if key == "input" else int(value)
    return sizes


def image_test(data: str | None) -> tuple[np.ndarray, np.ndarray]:
    """The test images of the run's data, flattened [n, features], and labels [n]: CIFAR-10's
    test_batch.bin, MNIST's t10k files, or without data the embedded MNIST digits."""
    is_cifar = data is not None and any(
        os.path.exists(os.path.join(d, "test_batch.bin"))
        for d in (data, os.path.join(data, "cifar-10-batches-bin"))
    )
    if is_cifar:
        images, labels = cifar_test(data)
        return images.reshape(len(images), -1), labels
    if data is not None and os.path.isdir(os.path.join(data, "train")):
        sys.exit("evaluate_model.py: image folders are not read here (MNIST and CIFAR-10 are)")
    return mnist_test(data)


def transformer_sizes(kind: str) -> dict:
    """The sizes of `transformer[:key=N,...]` (murmur's defaults for the others)."""
    sizes = {"layers": 2, "d_model": 128, "heads": 4, "context": 64, "d_ff": 512, "vocab": 256}
    if ":" in kind:
        for pair in kind.split(":", 1)[1].split(","):
            key, value = pair.split("=")
            sizes[key] = int(value)
    return sizes


TOKEN_MAGIC = 20240520  # llm.c / modded-nanogpt token files (node/src/train/data/tokens.rs)


def token_ids(raw: bytes, name: str) -> np.ndarray:
    """The u16 token ids of a .bin file: with the 256 × i32 llm.c header, or nanoGPT's
    header-less ids."""
    if raw[:4] == TOKEN_MAGIC.to_bytes(4, "little"):
        return np.frombuffer(raw[1024:], dtype="<u2")
    if len(raw) % 2:
        sys.exit(f"evaluate_model.py: {name}: neither a token file nor header-less u16 ids")
    return np.frombuffer(raw, dtype="<u2")


def sequences(held_out: np.ndarray, context: int) -> tuple[np.ndarray, np.ndarray]:
    """murmur's validation sequences: 256 (fewer if the part is short) of context + 1 ids
    spread evenly from the held-out part's start to its end (node/src/train/data/text.rs);
    inputs, targets."""
    length = context + 1
    last = len(held_out) - length
    n = min(256, last // context + 1)
    starts = [0] if n == 1 else [i * last // (n - 1) for i in range(n)]
    seqs = np.stack([held_out[s : s + length] for s in starts]).astype(np.int64)
    return seqs[:, :-1], seqs[:, 1:]


def text_validation(data: str | None, context: int) -> tuple[np.ndarray, np.ndarray]:
    """The language model's validation sequences as murmur makes them: of a byte-level text
    or a token file, the last 10%; of a folder of token files, its validation files (names
    with `val`, in name order)."""
    path = data or os.path.join(ROOT, "node", "data", "kjv", "kjv.txt.gz")
    if not os.path.exists(path):
        sys.exit(f"evaluate_model.py: {path}: no such file or folder (give the run's data with --data)")
    if os.path.isdir(path):
        names = sorted(f for f in os.listdir(path) if f.endswith(".bin") and "val" in f.lower())
        if not names:
            sys.exit(f"evaluate_model.py: {path} has no validation .bin file")
        held_out = np.concatenate(
            [token_ids(open(os.path.join(path, f), "rb").read(), f) for f in names]
        )
        return sequences(held_out, context)
    raw = open(path, "rb").read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    if raw[:4] == TOKEN_MAGIC.to_bytes(4, "little"):
        ids = token_ids(raw, path)
    else:
        ids = np.frombuffer(raw, dtype=np.uint8)
    return sequences(ids[int(len(ids) * 0.9) :], context)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", help="a run folder (holds model.safetensors and summary.json)")
    parser.add_argument("--data", help="the test data's folder (default: the run's --data)")
    parser.add_argument("--tolerance", type=float, default=0.01, help="percentage points")
    parser.add_argument("--peer", type=int, help="evaluate this peer's own model instead of x̄")
    args = parser.parse_args()

    summary = json.load(open(os.path.join(args.run, "summary.json")))
    config = tomllib.load(open(os.path.join(args.run, "run.toml"), "rb"))
    kind = summary["model"]
    data = args.data or config.get("data")
    name = kind.split(":")[0]
    if name in ("mlp", "cnn", "resnet20"):
        if name == "resnet20" and data is None:
            sys.exit("evaluate_model.py: this run trained on synthetic images; nothing to compare")
        sizes = image_sizes(kind)
        (c, h, w), classes = sizes["input"], sizes["classes"]
        if name == "mlp":
            model = ref.Mlp(sizes["hidden"], c * h * w, classes)
        elif name == "cnn":
            model = ref.Cnn(c, h, w, classes)
        else:
            model = ref.ResNet20(classes, channels=c)
        images, labels = image_test(data)
        if images.shape[1] != c * h * w:
            sys.exit(f"evaluate_model.py: {kind} takes {c}x{h}x{w} images; the data's are not")
        images = images.reshape(-1, c, h, w)
    elif name == "transformer":
        sizes = transformer_sizes(kind)
        model = ref.TransformerLM("naive", **sizes)
        images, labels = text_validation(data, sizes["context"])
    else:
        sys.exit(f"evaluate_model.py: no reference model for {kind} here")

    if args.peer is None:
        file, recorded, what = "model.safetensors", summary["final_avg_model_test_accuracy"], "x̄"
    else:
        file = os.path.join("peers", f"model-{args.peer}.safetensors")
        with open(os.path.join(args.run, "peers", f"peer-{args.peer}.jsonl")) as lines:
            recorded = json.loads(lines.read().splitlines()[-1])["test_accuracy"]
        what = f"peer {args.peer}"
    state = load_file(os.path.join(args.run, file))
    result = model.load_state_dict(state, strict=False)
    # PyTorch's BatchNorm also counts its batches; murmur has no such tensor.
    missing = [k for k in result.missing_keys if not k.endswith("num_batches_tracked")]
    if missing or result.unexpected_keys:
        sys.exit(f"evaluate_model.py: missing {missing}, unexpected {result.unexpected_keys}")
    model.eval()
    correct, total, loss = 0, 0, 0.0
    with torch.no_grad():
        for i in range(0, len(labels), 500):
            logits = model(torch.from_numpy(images[i : i + 500]))
            targets = torch.from_numpy(labels[i : i + 500])
            # A language model predicts every position: [B, T, V] against [B, T].
            logits, targets = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
            correct += int((logits.argmax(1) == targets).sum())
            total += len(targets)
            loss += float(torch.nn.functional.cross_entropy(logits, targets, reduction="sum"))
    accuracy = 100 * correct / total
    recorded = 100 * recorded
    print(
        f"{kind}: {accuracy:.2f}% on {len(labels)} test samples in PyTorch {torch.__version__}; "
        f"the run recorded {recorded:.2f}% for {what} (difference {accuracy - recorded:+.2f} points)"
    )
    if args.peer is None:
        recorded_loss = summary["final_avg_model_test_loss"]
        print(f"mean cross-entropy {loss / total:.5f} nats; the run recorded {recorded_loss:.5f}")
    if abs(accuracy - recorded) > args.tolerance:
        sys.exit(1)


if __name__ == "__main__":
    main()
