"""What a hostile `response_format` costs before it is answered or refused (issue 35): each schema of the
classes the held-back set attacks with, prepared as the server prepares a request (body checked, schema
compiled against what the answer can hold, prompt tokenized, the constraint made and its first mask),
in a child process of its own, with its wall time, the peak of what it allocated (tracemalloc, in a
second run of the same request) and the answer: the 400's message, or "accepted".

Before issue 35 the same classes took the server to 7.6 GiB and a MemoryError (60,000 properties, one
5 MB name), held it 90 s (one 5 MB enum string) or for good (`minLength` 10^9: a 1 GB closing text built
byte by byte on the event loop), or were a RecursionError (5,000 nested groups in a pattern).

    .venv/bin/python benchmarks/hostile_schemas.py [--context 2048] [--max-tokens N] [--timeout 120]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "models" / "smollm2-135m-instruct"
BIG = 5_000_000


def cases() -> dict[str, object]:
    many = {f"p{i}_{'x' * 70}": {"type": "string"} for i in range(60_000)}
    strings = {"type": "string", "minLength": 300}
    return {
        "60,000 properties (5 MB)": {"type": "object", "properties": many},
        "one 5 MB property name": {"type": "object", "properties": {"n" * BIG: {}}, "required": ["n" * BIG]},
        "one 5 MB enum string": {"enum": ["e" * BIG]},
        "a 4 KB property name": {"type": "object", "properties": {"n" * 4000: {}}, "required": ["n" * 4000]},
        "2,000 properties": {"type": "object", "properties": {f"p{i}_{'x' * 70}": {} for i in range(2000)}},
        "20,000 enum values": {"enum": [f"value{i}" for i in range(20_000)]},
        "minLength 10^9 (100 bytes)": {"type": "string", "minLength": 10**9},
        "minLength 10^6": {"type": "string", "minLength": 10**6},
        "minLength 1,000": {"type": "string", "minLength": 1000},
        "maxLength 10^9": {"type": "string", "maxLength": 10**9},
        "minItems 10^18": {"type": "array", "minItems": 10**18},
        "minItems 300 x minLength 300": {"type": "array", "minItems": 300, "items": strings},
        "a pattern of 5,000 nested groups": {"type": "string", "pattern": "(" * 5000 + "a" + ")" * 5000},
        "a pattern a{1000}{1000}": {"type": "string", "pattern": "^a{1000}{1000}$"},
    }  # fmt: skip


def child(name: str, context: int, max_tokens: int | None) -> None:
    """Prepare one case as the server does; print one JSON line: seconds, MiB above the model, answer."""
    import ruvllm
    from ruvllm.completions import prepare
    from ruvllm.errors import RuvLLMError

    model = ruvllm.load(str(MODEL))
    model.vocabulary  # noqa: B018  (built once per server, before any request: not this request's cost)
    body = {
        "messages": [{"role": "user", "content": "Hi"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": cases()[name]}},
    }
    if max_tokens is not None:
        body["max_tokens"] = max_tokens

    def request() -> str:
        try:
            prepared = prepare(body, "chat", model.tokenizer, context, model.name, "ignore")
            constraint = prepared.constraint(model.vocabulary)
            assert constraint is not None
            constraint.allowed()
            return "accepted"
        except RuvLLMError as e:
            return f"400: {str(e)[:160]}"

    started = time.perf_counter()
    answer = request()
    seconds = time.perf_counter() - started
    tracemalloc.start()
    request()
    peak = tracemalloc.get_traced_memory()[1] / (1 << 20)
    print(json.dumps({"seconds": seconds, "mib": peak, "answer": answer}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--context", type=int, default=2048, help="the server's --max-context")
    parser.add_argument("--max-tokens", type=int, help="the requests' max_tokens (default: none)")
    parser.add_argument("--timeout", type=float, default=120, help="seconds before a case counts as a hang")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.context, args.max_tokens)
        return
    print(f"context {args.context}, max_tokens {args.max_tokens}; SmolLM2's tokenizer", flush=True)
    print(f"{'case':36} {'time':>8} {'memory':>9}  answer")
    for name in cases():
        command = [sys.executable, __file__, "--child", name, "--context", str(args.context)]
        if args.max_tokens is not None:
            command += ["--max-tokens", str(args.max_tokens)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout, check=False)
            lines = done.stdout.strip().splitlines()
            result = json.loads(lines[-1]) if done.returncode == 0 and lines else None
        except subprocess.TimeoutExpired:
            print(f"{name:36} {'>' + str(int(args.timeout)) + ' s':>8} {'':>9}  HANG")
            continue
        if result is None:
            print(f"{name:36} {'':>8} {'':>9}  CRASH: {done.stderr.strip().splitlines()[-1:]}")
            continue
        print(f"{name:36} {result['seconds'] * 1000:7.0f}ms {result['mib']:7.0f}MiB  {result['answer']}", flush=True)


if __name__ == "__main__":
    main()
