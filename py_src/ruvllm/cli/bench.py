"""`ruvllm bench MODEL`: prefill, time to first token, decode speed and memory, as a table, JSON or CSV."""

from __future__ import annotations

import argparse
import json

from ..errors import InvalidArgumentError
from .common import add_load_options, command_main, load_model, local_model

HELP = "prefill, time to first token, decode speed and memory"
COLUMNS = (
    "compute",
    "prompt_tokens",
    "generated_tokens",
    "prefill_ms",
    "ttft_ms",
    "decode_tok_s",
    "peak_rss_bytes",
    "weight_bytes",
    "kv_hot_bytes",
    "kv_cold_bytes",
    "kv_cold_format",
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model")
    p.add_argument("--prompt-length", type=int, default=128)
    p.add_argument("--gen-length", type=int, default=64)
    p.add_argument("--format", choices=("table", "json", "csv"), default="table")
    add_load_options(p)


def run(args: argparse.Namespace) -> int:
    from ..api import calibration_text
    from ..tools.bench import run_bench

    if args.prompt_length < 1 or args.gen_length < 1:
        raise InvalidArgumentError("--prompt-length and --gen-length must be >= 1")
    _check_lengths(args)  # before the slow load: the header tells the context
    model = load_model(args)
    ids = model.tokenizer.encode(calibration_text())
    while len(ids) < args.prompt_length:
        ids = ids + ids
    result = run_bench(model.engine, ids[: args.prompt_length], args.gen_length)
    if args.format == "json":
        print(json.dumps(result))
    elif args.format == "csv":
        print(",".join(COLUMNS))
        print(",".join("" if result[c] is None else str(result[c]) for c in COLUMNS))
    else:
        for key in COLUMNS:
            value = result[key]
            shown = f"{value:.2f}" if isinstance(value, float) else ("-" if value is None else str(value))
            if key.endswith("_bytes") and isinstance(value, int):
                shown = f"{value / 2**20:.1f} MiB"
            print(f"{key:18s} {shown}")
    return 0


def _check_lengths(args: argparse.Namespace) -> None:
    """The prompt and the generated tokens must fit the context the model will be loaded with."""
    from ..runtime.assembly import open_model
    from ..runtime.engine import resolve_context

    local_model(args)
    config, _ = open_model(args.model, header_only=True)
    context = resolve_context(config, args.context_length)
    needed = args.prompt_length + args.gen_length
    if needed > context:
        most = config.max_position_embeddings
        where = "--context-length" if args.context_length else "the default context (--context-length)"
        raise InvalidArgumentError(
            f"--prompt-length {args.prompt_length} + --gen-length {args.gen_length} need {needed} positions, "
            f"more than {where} of {context}; this model takes at most {most}"
        )


def main(argv: list[str] | None = None) -> int:
    return command_main(__name__, argv)
