"""What the width of x costs in the fast arithmetic: SmolLM2 q4's perplexity on benchmarks/data/eval.txt
with x rounded per group of 32 to b bits before every quantized product, emulated in NumPy on CPython.

    python benchmarks/relaxed/x_bits_perplexity.py [--bits exact,16,15,8]

The fast kernels' scheme (kernels/kernels.c, quantize_x): d = max|x| / (2^(b-1) - 1) per group,
xq = round(x / d), the codes meet d * xq, and the mins meet the exact group sums of x. 16 bits is what the
kernels do; 15 bits is what the relaxed dot needs to split x into a signed and a 7-bit byte (docs/kernels.md,
"Relaxed SIMD"); 8 bits is llama.cpp's q8_0 activations. Windows of 1024 tokens, chunks of 64.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

import ruvllm
from ruvllm.files.formats import GROUP
from ruvllm.quant.matrices import Int8Matrix
from ruvllm.tools.perplexity import perplexity

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "models" / "smollm2-135m-instruct"
EVAL = ROOT / "benchmarks" / "data" / "eval.txt"


def rounded(x: np.ndarray, bits: int) -> np.ndarray:
    """x (T, K) as the fast kernels see it: d * round(x / d) per group of 32, in float32 as they form it."""
    T, K = x.shape
    g = x.reshape(T, K // GROUP, GROUP)  # (T, G, 32)
    d = np.abs(g).max(axis=-1, keepdims=True) / np.float32(2 ** (bits - 1) - 1)  # (T, G, 1)
    inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, 1), 0).astype(np.float32)
    return (np.rint(g * inv) * d).astype(np.float32).reshape(T, K)  # (T, K)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bits", default="exact,16,15,8")
    args = parser.parse_args()
    model = ruvllm.load(MODEL, compute="q4")
    ids = model.tokenizer.encode(EVAL.read_text())
    plain_call = Int8Matrix.__call__
    for label in args.bits.split(","):
        if label == "exact":
            Int8Matrix.__call__ = plain_call
        else:
            bits = int(label)

            def call(self: Int8Matrix, x: np.ndarray, bits: int = bits) -> np.ndarray:
                xr = rounded(x, bits)  # (T, K)
                y = plain_call(self, xr)  # (T, N)
                if self.mins is not None:  # the mins meet the exact group sums of x
                    T, K = x.shape
                    dx = (x - xr).reshape(T, K // GROUP, GROUP).sum(-1)  # (T, G)
                    y = y + dx @ self.mins.T
                return y

            Int8Matrix.__call__ = call
        started = time.perf_counter()
        result = perplexity(model.engine, ids, 1024)
        seconds = time.perf_counter() - started
        print(
            json.dumps(
                {
                    "x": label,
                    "perplexity": round(result.perplexity, 4),
                    "tokens": result.tokens,
                    "seconds": round(seconds, 1),
                }
            ),
            flush=True,
        )
    Int8Matrix.__call__ = plain_call


if __name__ == "__main__":
    main()
