"""The parts of reading a GGUF whose speed once lived in unit tests (timed assertions fail on a busy
machine): decoding a 2048 x 2048 matrix of each grid type (IQ*), beside gguf-py's decoder in the same run,
and deriving Gemma 3's 514,906 merges from its vocabulary. Medians of --repeats runs.

    .venv/bin/python benchmarks/gguf_parts_bench.py [--repeats 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
GEMMA = ROOT / "build" / "downloads" / "gemma-3-270m-q4_k_m.gguf"


def median_ms(run, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


def random_blocks(type_name: str, rows: int, columns: int) -> np.ndarray:
    """Random rows of `type_name` blocks whose f16 scale (the block's first two bytes) is finite."""
    from ruvllm.files.ggml import GGML_TYPE_NAMES

    t = GGML_TYPE_NAMES[type_name]
    rng = np.random.default_rng(9)
    raw = rng.integers(0, 256, (rows, t.row_bytes(columns)), dtype=np.uint8)
    if type_name != "IQ1_M":  # (IQ1_M keeps its scale in nibbles elsewhere; random bits are finite enough)
        blocks = raw.reshape(-1, t.type_size)
        blocks[:, 0:2] = rng.uniform(-1, 1, (len(blocks), 1)).astype(np.float16).view(np.uint8)
    return raw


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="BLAS threads (NumPy's elementwise work is single)")
    args = parser.parse_args()
    from threadpoolctl import threadpool_limits

    threadpool_limits(args.threads)
    import gguf
    from gguf.quants import dequantize as gguf_dequantize

    from ruvllm.files.ggml import DEQUANTIZE_ONLY, dequantize

    print(f"{'grid type 2048 x 2048':24s} {'ruvllm ms':>10s} {'gguf-py ms':>11s} {'ratio':>6s}")
    for name in DEQUANTIZE_ONLY:
        raw = random_blocks(name, 2048, 2048)
        with np.errstate(invalid="ignore"):  # (random IQ1_M scales may be infinite)
            ours = median_ms(lambda raw=raw, name=name: dequantize(name, raw, 2048), args.repeats)
            theirs = median_ms(lambda raw=raw, name=name: gguf_dequantize(raw, gguf.GGMLQuantizationType[name]), 1)
        print(f"{name:24s} {ours:10.1f} {theirs:11.1f} {ours / theirs:6.2f}")

    if not GEMMA.exists():
        print(f"(no {GEMMA.relative_to(ROOT)}: ./build.sh gemma fetches it; the merges are not measured)")
        return
    from ruvllm.files.gguf_vocab import merges_by_position, tokenizer_files

    metadata = {name: field.contents() for name, field in gguf.GGUFReader(GEMMA).fields.items()}
    tokens = metadata["tokenizer.ggml.tokens"]
    tokens = ["\u2581" * len(t) if " " in t and not t.strip() else t for t in tokens]
    vocab = {token: index for index, token in enumerate(tokens)}
    merges = median_ms(lambda: merges_by_position(tokens, vocab), args.repeats)
    files = median_ms(lambda: tokenizer_files(metadata, "gemma.gguf"), args.repeats)
    print(f"Gemma 3: merges derived in {merges:.0f} ms; the whole tokenizer.json in {files:.0f} ms")


if __name__ == "__main__":
    main()
