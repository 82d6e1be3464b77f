"""Coverage and correctness of the JSON-schema constraint (runtime/constrain/) on public suites no one
here wrote, read from folders given on the command line (nothing is fetched at run time):

- JSON-Schema-Test-Suite (github:json-schema-org/JSON-Schema-Test-Suite), draft 2020-12, required
  tests (not `optional/`): how many groups (one schema each) compile, and of their instances how many
  valid ones are accepted and how many invalid ones are (wrongly) accepted, byte by byte to the end.
- JSONSchemaBench (github:guidance-ai/jsonschemabench): the compile rate of each dataset under `data/`,
  with the most frequent refusals; and MaskBench (`maskbench/data/`), scored as its README scores
  engines: a schema passes when it compiles and each of its instances, written as
  `json.dumps(data, ensure_ascii=False)` and tokenized, is accepted token by token if valid and refused
  at some token if invalid (the end of the document is not checked, as in its runner). The mask of
  every token is also computed and timed (MaskBench's TBM) unless --no-masks; time to first mask
  (TTFM) is the compile time plus the first mask.

- With --generate N (and --jsonschemabench): the check issue 27's target names, on the real model
  (SmolLM2-135M-Instruct): N random JSONSchemaBench schemas that compile, --samples generations each
  at temperature 1 (`response_format: json_schema`, --max-tokens), and every output that finished
  (finish_reason "stop") must validate under `jsonschema` (formats not checked, as its default
  validator does). Slow: ~N x samples x (a few seconds); the tests run a tiny version. --shard I/N runs
  the I-th of N parts (side by side on N cores). --speed also times decoding under each schema against
  the same model without it (issue 27's ">= 0.95x unconstrained"; run it alone on a quiet machine).
  With --generate, JSONSchemaBench's coverage and MaskBench are not run.

The tokenizer is SmolLM2's (MaskBench's published figures use Llama 3.1's: the pass counts compare,
the times only roughly).

    .venv/bin/python benchmarks/schema_suites.py --test-suite /tmp/suites/tests --jsonschemabench /tmp/suites/jsb \\
        [--sample 0.1] [--no-masks] [--json out.json]
    .venv/bin/python benchmarks/schema_suites.py --jsonschemabench /tmp/suites/jsb \\
        --generate 40 --samples 20 --max-tokens 256 [--shard 0/2] [--speed]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

from ruvllm.errors import RuvLLMError
from ruvllm.runtime.constrain import Matcher, Vocabulary, json_grammar
from ruvllm.text.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "models" / "smollm2-135m-instruct"
PUBLISHED_MASKBENCH = {"LLGuidance": 8909, "XGrammar": 8122, "Outlines-core": 7050, "llama.cpp": 6505}


def compile_schema(schema: object) -> tuple[object, str | None]:
    """(grammar, None), or (None, why it was refused); a crash is reported as a refusal marked CRASH."""
    try:
        # the instances are written with json.dumps' default separators (", ", ": "), as MaskBench's runner does
        return json_grammar(schema, whitespace="flexible"), None  # type: ignore[arg-type]
    except RuvLLMError as e:
        return None, str(e)
    except Exception as e:  # the point is to count what escapes a clean refusal
        return None, f"CRASH {type(e).__name__}: {e}"


def reason(message: str) -> str:
    """A refusal without its path or the list of what is supported, so that refusals group by kind."""
    message = re.sub(r"\s*\(supported: .*\)", "", message.removeprefix("json_schema: "))
    return re.sub(r" at (the root|\S+)", "", message)[:100]


def reads(grammar, vocabulary: Vocabulary, data: bytes) -> bool:
    """Whether the grammar takes `data` byte by byte (tokens BYTE0 + b) and is complete at its end."""
    matcher = Matcher(grammar, vocabulary)
    try:
        for b in data:
            matcher.advance(1 + b)
    except RuvLLMError:
        return False
    return matcher.complete


def test_suite(folder: Path, sample: float, rng: random.Random) -> dict:
    files = sorted((folder / "tests" / "draft2020-12").glob("*.json"))
    if not files:
        sys.exit(f"--test-suite: no tests/draft2020-12/*.json under {folder}")
    vocabulary = Vocabulary([b"</s>", *(bytes([b]) for b in range(256))], 257, [], [0])
    groups = compiled = valid = valid_accepted = invalid = invalid_accepted = 0
    refusals: Counter = Counter()
    wrong: list[str] = []
    for file in files:
        for group in json.loads(file.read_text()):
            if rng.random() >= sample:
                continue
            groups += 1
            grammar, why = compile_schema(group["schema"])
            if grammar is None:
                refusals[reason(why or "")] += 1
                continue
            compiled += 1
            for test in group["tests"]:
                text = json.dumps(test["data"], ensure_ascii=False).encode("utf-8")
                accepted = reads(grammar, vocabulary, text)
                if test["valid"]:
                    valid += 1
                    valid_accepted += accepted
                else:
                    invalid += 1
                    invalid_accepted += accepted
                    if accepted:
                        wrong.append(f"{file.stem}: {group['description']}: {test['description']}")
    return {
        "groups": groups,
        "compiled": compiled,
        "valid": valid,
        "valid_accepted": valid_accepted,
        "invalid": invalid,
        "invalid_accepted": invalid_accepted,
        "invalid_accepted_cases": wrong,
        "top_refusals": refusals.most_common(15),
    }


def jsonschemabench(folder: Path, sample: float, rng: random.Random) -> dict:
    datasets = sorted(p for p in (folder / "data").iterdir() if p.is_dir()) if (folder / "data").is_dir() else []
    if not datasets:
        sys.exit(f"--jsonschemabench: no data/<dataset>/ folders under {folder}")
    out: dict = {}
    refusals: Counter = Counter()
    for dataset in datasets:
        files = [f for f in sorted(dataset.glob("*.json")) if rng.random() < sample]
        ok = 0
        for file in files:
            grammar, why = compile_schema(json.loads(file.read_text()))
            ok += grammar is not None
            if grammar is None:
                refusals[reason(why or "")] += 1
        out[dataset.name] = {"schemas": len(files), "compiled": ok}
    return {"datasets": out, "top_refusals": refusals.most_common(25)}


def maskbench(folder: Path, sample: float, rng: random.Random, tokenizer: Tokenizer, masks: bool) -> dict:
    files = [f for f in sorted((folder / "maskbench" / "data").glob("*.json")) if rng.random() < sample]
    if not files:
        sys.exit(f"--jsonschemabench: no maskbench/data/*.json under {folder}")
    eos = [tokenizer.token_id("<|im_end|>"), tokenizer.token_id("<|endoftext|>")]
    vocabulary = Vocabulary(tokenizer.token_bytes, len(tokenizer.token_bytes), tokenizer.special_ids, eos)
    counts = Counter()
    accepted_invalid: list[str] = []  # the schema files whose invalid instance was accepted, and the instance
    mask_us: list[float] = []
    ttfm_us: list[float] = []
    for file in files:
        data = json.loads(file.read_text())
        started = time.perf_counter()
        grammar, why = compile_schema(data["schema"])
        if grammar is None:
            counts["crash" if (why or "").startswith("CRASH") else "compile error"] += 1
            continue
        verdict, first = "passing", True
        for test in data["tests"]:
            tokens = tokenizer.encode(json.dumps(test["data"], ensure_ascii=False), add_special_tokens=False)
            matcher = Matcher(grammar, vocabulary)
            accepted = True
            for token in tokens:
                if masks:
                    t0 = time.perf_counter()
                    allowed = matcher.allowed()
                    mask_us.append((time.perf_counter() - t0) * 1e6)
                    if first:
                        ttfm_us.append((time.perf_counter() - started) * 1e6)
                        first = False
                    if not allowed[token]:
                        accepted = False
                        break
                try:
                    matcher.advance(token)
                except RuvLLMError:
                    accepted = False
                    break
            if accepted != test["valid"]:
                verdict = "invalidation error" if accepted else "validation error"
                if accepted:
                    accepted_invalid.append(f"{file.name}: {json.dumps(test['data'], ensure_ascii=False)[:160]}")
                break
        counts[verdict] += 1
    out: dict = {"schemas": len(files), **{k: counts[k] for k in ("passing", "compile error", "crash")}}
    out |= {k: counts[k] for k in ("validation error", "invalidation error")}
    out["invalid_accepted_cases"] = accepted_invalid
    for name, values in (("tbm", mask_us), ("ttfm", ttfm_us)):
        if values:
            array = np.array(values)
            out[f"{name}_us"] = {f"p{q}": float(np.percentile(array, q)) for q in (50, 75, 90, 95, 99, 99.9, 100)}
    return out


def generations(
    folder: Path,
    count: int,
    samples: int,
    max_tokens: int,
    rng: random.Random,
    model=None,
    shard: tuple[int, int] = (0, 1),
    speed: bool = False,
) -> dict:
    """`samples` generations at temperature 1 on each of `count` random compiled JSONSchemaBench schemas:
    how many finished, and of those how many validate (the failures listed). shard (i, n): only the
    schemas whose place among the `count` is i modulo n (the same schemas and seeds as one whole run;
    shards run side by side). speed: each schema's first finished output of 8 tokens or more is followed
    by the same prompt and seed without the schema, with ignore_eos, to the same number of tokens; the
    wall times of both are summed (the prompt is cached by then for both; the constrained one includes
    compiling its grammar, as a request does)."""
    import jsonschema

    import ruvllm

    model = model if model is not None else ruvllm.load(str(MODEL))
    files = sorted((folder / "data").glob("*/*.json"))
    if not files:
        sys.exit(f"--jsonschemabench: no data/<dataset>/*.json under {folder}")
    rng.shuffle(files)
    counts: Counter = Counter()
    times: Counter = Counter()
    failures: list[str] = []
    schemas = 0
    for file in files:
        if schemas == count:
            break
        schema = json.loads(file.read_text())
        fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
        prompt = "Reply with one JSON document that follows this JSON Schema:\n" + json.dumps(schema)[:1500]
        messages = [{"role": "user", "content": prompt}]
        try:
            model.create_chat_completion(messages, max_tokens=1, response_format=fmt)
        except RuvLLMError:
            continue  # refused (or a body nested too deep for the API): not one of the compiled schemas
        schemas += 1
        if (schemas - 1) % shard[1] != shard[0]:
            continue
        checker = jsonschema.validators.validator_for(schema)(schema)
        timed = not speed
        for seed in range(samples):
            start = time.perf_counter()
            answer = model.create_chat_completion(
                messages, max_tokens=max_tokens, temperature=1, seed=seed, response_format=fmt
            )
            seconds = time.perf_counter() - start
            choice = answer["choices"][0]
            if choice["finish_reason"] != "stop":
                counts["cut by max_tokens"] += 1
                continue
            counts["finished"] += 1
            tokens = answer["usage"]["completion_tokens"]
            if not timed and tokens >= 8:
                start = time.perf_counter()
                free = model.create_chat_completion(
                    messages, max_tokens=tokens, temperature=1, seed=seed, ignore_eos=True
                )
                times["unconstrained"] += time.perf_counter() - start
                assert free["usage"]["completion_tokens"] == tokens, free["usage"]
                times["constrained"] += seconds
                counts["timed tokens"] += tokens
                timed = True
            text = choice["message"]["content"]
            try:
                errors = list(checker.iter_errors(json.loads(text)))
            except json.JSONDecodeError as e:
                errors = [f"not JSON: {e}"]
            if errors:
                failures.append(f"{file.parent.name}/{file.name} seed {seed}: {str(errors[0])[:200]} in {text[:200]!r}")
            else:
                counts["valid"] += 1
    mine = len(range(shard[0], schemas, shard[1]))
    return {"schemas": mine, "samples": samples, **counts, "seconds": dict(times), "failures": failures}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--test-suite", type=Path, help="a JSON-Schema-Test-Suite checkout")
    parser.add_argument("--jsonschemabench", type=Path, help="a jsonschemabench checkout (data/, maskbench/data/)")
    parser.add_argument("--sample", type=float, default=1.0, help="fraction of schemas to try (seeded), 0 < s <= 1")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-masks", action="store_true", help="MaskBench: check tokens without timing masks")
    parser.add_argument("--json", type=Path, help="also write the figures to this file (not over an existing one)")
    parser.add_argument("--generate", type=int, default=0, help="with --jsonschemabench: generate on N random schemas")
    parser.add_argument("--samples", type=int, default=20, help="--generate: generations per schema (temperature 1)")
    parser.add_argument("--max-tokens", type=int, default=256, help="--generate: max_tokens of each generation")
    parser.add_argument("--shard", default="0/1", help="--generate: I/N, the I-th of N runs side by side")
    parser.add_argument(
        "--speed", action="store_true", help="--generate: time each schema's first output against no schema"
    )
    args = parser.parse_args()
    if args.generate < 0 or args.samples < 1 or args.max_tokens < 1:
        parser.error("--generate must be >= 0, --samples and --max-tokens >= 1")
    shard = re.fullmatch(r"(\d+)/(\d+)", args.shard)
    if shard is None or not int(shard[1]) < int(shard[2]):
        parser.error(f"--shard must be I/N with 0 <= I < N, got {args.shard!r}")
    if args.generate and args.jsonschemabench is None:
        parser.error("--generate needs --jsonschemabench")
    if not 0 < args.sample <= 1:
        parser.error(f"--sample must be in (0, 1], got {args.sample}")
    if args.json is not None and args.json.exists():
        parser.error(f"--json {args.json} exists")
    if args.test_suite is None and args.jsonschemabench is None:
        parser.error("give --test-suite and/or --jsonschemabench")
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    results: dict = {"sample": args.sample}
    if args.test_suite is not None:
        r = results["test_suite"] = test_suite(args.test_suite, args.sample, random.Random(args.seed))
        print(
            f"JSON-Schema-Test-Suite draft2020-12: {r['compiled']}/{r['groups']} groups compile; "
            f"valid accepted {r['valid_accepted']}/{r['valid']}, "
            f"invalid accepted {r['invalid_accepted']}/{r['invalid']}"
        )
        for case in r["invalid_accepted_cases"]:
            print(f"  INVALID ACCEPTED: {case}")
        for why, n in r["top_refusals"]:
            print(f"  {n:5d}  {why}")
    if args.jsonschemabench is not None and not args.generate:
        r = results["jsonschemabench"] = jsonschemabench(args.jsonschemabench, args.sample, random.Random(args.seed))
        total = sum(d["schemas"] for d in r["datasets"].values())
        ok = sum(d["compiled"] for d in r["datasets"].values())
        print(f"JSONSchemaBench: {ok}/{total} compile ({ok / max(total, 1):.1%})")
        for name, d in r["datasets"].items():
            print(f"  {name:16s} {d['compiled']:5d}/{d['schemas']:5d} ({d['compiled'] / max(d['schemas'], 1):.1%})")
        print("  most frequent refusals:")
        for why, n in r["top_refusals"]:
            print(f"  {n:5d}  {why}")
        tokenizer = Tokenizer.from_folder(str(MODEL))
        r = results["maskbench"] = maskbench(
            args.jsonschemabench, args.sample, random.Random(args.seed), tokenizer, not args.no_masks
        )
        print(
            f"MaskBench: {r['passing']}/{r['schemas']} passing (compile error {r['compile error']}, "
            f"crash {r['crash']}, validation error {r['validation error']}, "
            f"invalidation error {r['invalidation error']})"
        )
        for case in r["invalid_accepted_cases"]:
            print(f"  INVALID ACCEPTED: {case}")
        if args.sample < 1:
            print(f"  scaled to all 11,305 schemas: ~{r['passing'] / args.sample:.0f} passing")
        print("  published (all 11,305): " + ", ".join(f"{k} {v:,}" for k, v in PUBLISHED_MASKBENCH.items()))
        for name in ("tbm_us", "ttfm_us"):
            if name in r:
                print(f"  {name}: " + ", ".join(f"{q} {v:,.0f}" for q, v in r[name].items()))
    if args.generate:
        r = results["generations"] = generations(
            args.jsonschemabench,
            args.generate,
            args.samples,
            args.max_tokens,
            random.Random(args.seed),
            shard=(int(shard[1]), int(shard[2])),
            speed=args.speed,
        )
        print(
            f"Generations: {r['schemas']} schemas x {r['samples']} at temperature 1: {r.get('finished', 0)} finished, "
            f"{r.get('valid', 0)} of them valid, {r.get('cut by max_tokens', 0)} cut by max_tokens"
        )
        for failure in r["failures"]:
            print(f"  INVALID: {failure}")
        if r["seconds"]:
            c, u = r["seconds"]["constrained"], r["seconds"]["unconstrained"]
            print(
                f"  speed over {r['timed tokens']} tokens (one output per schema): with the schema {c:.2f} s, "
                f"without {u:.2f} s: {u / c:.3f}x unconstrained"
            )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
