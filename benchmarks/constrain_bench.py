"""Cost of JSON-constrained decoding (runtime/constrain/) per token, against the model's own decode time.

For three schemas (a flat object and nested arrays of objects, the "flat" and "nested" of
tests/data/schemas.json that tests/test_constrain.py walks too, and json_object) with the SmolLM2 tokenizer
(49152 tokens): documents are sampled from random logits, and the time of each `Matcher.allowed()` is
recorded: median, p95, the first token of a request, and the worst. Every document compiles its grammar
afresh, as a request does, so the memoized masks start empty each time. Two samplers:
- "random": standard-normal logits (strings then run ~1600 tokens before a closing quote is drawn);
- "biased": the same plus 4 on tokens that are not plain string text, so strings end after a few
  tokens and structure dominates, as in real model output.
Also the Vocabulary build time, and, if the model folder loads, its greedy decode ms/token (32 tokens)
and the ratio of mask time to it.

    .venv/bin/python benchmarks/constrain_bench.py [--docs 20] [--max-tokens 400]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from ruvllm.runtime.constrain import Matcher, Vocabulary, json_grammar
from ruvllm.text.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "models" / "smollm2-135m-instruct"

# the flat and nested schemas of tests/test_constrain.py, from the file the tests read
SHARED = json.loads((ROOT / "tests" / "data" / "schemas.json").read_text(encoding="utf-8"))["schemas"]
SCHEMAS = {"flat object": SHARED["flat"], "nested arrays of objects": SHARED["nested"], "json_object": None}


def sample_documents(
    schema: dict | None, vocabulary: Vocabulary, docs: int, max_tokens: int, bias: float, seed: int
) -> dict:
    rng = np.random.default_rng(seed)
    boost = np.where(vocabulary.plain_mask, 0.0, bias)  # (V,)
    times, firsts, setups, lengths, completed = [], [], [], [], 0
    for _ in range(docs):
        started = time.perf_counter()
        matcher = Matcher(json_grammar(schema), vocabulary)
        setups.append(time.perf_counter() - started)
        for step in range(max_tokens):
            started = time.perf_counter()
            allowed = matcher.allowed()  # (V,)
            elapsed = time.perf_counter() - started
            (firsts if step == 0 else times).append(elapsed)
            if matcher.complete:
                completed += 1
                break
            ids = np.flatnonzero(allowed)  # (A,)
            logits = rng.standard_normal(len(ids)) + boost[ids]  # (A,)
            matcher.advance(int(ids[np.argmax(logits + rng.gumbel(size=len(ids)))]))
        lengths.append(step)
    ms = np.array(times) * 1000
    return {
        "median_ms": float(np.median(ms)),
        "p95_ms": float(np.percentile(ms, 95)),
        "mean_ms": float(ms.mean()),
        "max_ms": float(ms.max()),
        "first_ms": float(np.median(firsts) * 1000),
        "setup_ms": float(np.median(setups) * 1000),
        "tokens": len(times),
        "docs_complete": completed,
        "mean_tokens_per_doc": float(np.mean(lengths)),
    }


LONG_TEXT = {  # a schema whose answer is long: decode speed is measured over many constrained tokens
    "type": "object",
    "properties": {"title": {"type": "string", "maxLength": 40}, "story": {"type": "string", "minLength": 400}},
    "required": ["title", "story"],
    "additionalProperties": False,
}


def model_decode_ms() -> tuple[float, float] | None:
    """Decode ms/token of the model, unconstrained and under LONG_TEXT (end to end: masks, sampling),
    alternating three times in the same run; the medians."""
    import ruvllm
    from ruvllm.errors import RuvLLMError

    try:
        model = ruvllm.load(str(MODEL), compute="f32")
    except (RuvLLMError, OSError) as e:
        print(f"model: not loaded ({e})")
        return None
    messages = [{"role": "user", "content": "Write a story as JSON with a title and the story."}]
    fmt = {"type": "json_schema", "json_schema": {"name": "story", "schema": LONG_TEXT}}
    free, constrained = [], []
    for _ in range(3):
        chunks = list(model.chat(messages, temperature=0, max_tokens=96, ignore_eos=True))
        free.append(1000.0 / chunks[-1].stats.decode_tok_s)
        started = time.perf_counter()
        answer = model.create_chat_completion(messages, temperature=0, max_tokens=96, response_format=fmt)
        seconds, tokens = time.perf_counter() - started, answer["usage"]["completion_tokens"]
        prefill = chunks[-1].stats.ttft_ms / 1000  # the same prompt's time to first token, unconstrained
        constrained.append(1000.0 * (seconds - prefill) / max(1, tokens - 1))
    return float(np.median(free)), float(np.median(constrained))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=20, help="documents per schema and sampler")
    parser.add_argument("--max-tokens", type=int, default=400, help="tokens per document at most")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()

    tokenizer = Tokenizer.from_folder(str(MODEL))
    eos = [tokenizer.token_id("<|im_end|>"), tokenizer.token_id("<|endoftext|>")]
    vocabulary = Vocabulary(tokenizer.token_bytes, len(tokenizer.token_bytes), tokenizer.special_ids, eos)
    print(f"vocabulary: {vocabulary.size} tokens, built in {vocabulary.build_seconds * 1000:.0f} ms")
    results = {"vocabulary_build_ms": vocabulary.build_seconds * 1000, "schemas": {}}
    for name, schema in SCHEMAS.items():
        for sampler, bias in (("random", 0.0), ("biased", 4.0)):
            r = sample_documents(schema, vocabulary, args.docs, args.max_tokens, bias, seed=0)
            results["schemas"][f"{name} / {sampler}"] = r
            print(
                f"{name:26s} {sampler:6s}: mask median {r['median_ms']:.3f} ms, p95 {r['p95_ms']:.3f} ms, "
                f"mean {r['mean_ms']:.3f} ms, max {r['max_ms']:.1f} ms, first token {r['first_ms']:.3f} ms, "
                f"grammar + matcher {r['setup_ms']:.2f} ms "
                f"({r['tokens']} tokens, {r['docs_complete']}/{args.docs} documents complete, "
                f"{r['mean_tokens_per_doc']:.0f} tokens each)"
            )
    measured = model_decode_ms()
    if measured is not None:
        decode, constrained = measured
        results["model_decode_ms_per_token"], results["constrained_decode_ms_per_token"] = measured
        print(f"model decode (f32, greedy, 96 tokens): {decode:.1f} ms/token unconstrained, {constrained:.1f} ms/token")
        print(f"  under a JSON schema, end to end (ratio {decode / constrained:.2f}x of the unconstrained speed)")
        for key, r in results["schemas"].items():
            print(f"  {key:36s}: mean mask / decode = {r['mean_ms'] / decode:.1%}, p95 {r['p95_ms'] / decode:.1%}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
