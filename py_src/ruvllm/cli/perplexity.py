"""`ruvllm perplexity MODEL --text-file FILE`: the model's perplexity on a text, window by window."""

from __future__ import annotations

import argparse
import json

from .common import ADAPTER_HELP, add_load_options, command_main, load_model, load_options, read_text

HELP = "perplexity of the model on a text file"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model")
    p.add_argument("--text-file", required=True)
    p.add_argument("--window", type=int, help="tokens per evaluation window (default: the context length)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--adapter", help=ADAPTER_HELP)
    add_load_options(p)


def run(args: argparse.Namespace) -> int:
    from ..tools.perplexity import check_window, perplexity

    if args.window is not None:
        check_window(args.window)  # before the slow load
    text = read_text(args.text_file, "--text-file")
    o = load_options(args)
    model = load_model(args)
    engine = model.engine
    result = perplexity(engine, model.tokenizer.encode(text), args.window)
    report = {
        "perplexity": result.perplexity,
        "nll": result.nll,
        "tokens": result.tokens,
        "windows": result.windows,
        "compute": engine.plan.compute,
        "isq": o.isq,
        "kv": {"hot_tokens": o.kv.hot_tokens, "cold": o.kv.cold if o.kv.hot_tokens else None},
    }
    if args.json:
        print(json.dumps(report))
    else:
        where = f"{result.windows} windows, compute {engine.plan.compute}"
        print(f"perplexity {result.perplexity:.4f} over {result.tokens} tokens ({where})")
    return 0


def main(argv: list[str] | None = None) -> int:
    return command_main(__name__, argv)
