"""`ruvllm merge MODEL ADAPTER --out FOLDER`: a model folder with a LoRA adapter merged into its weights."""

from __future__ import annotations

import argparse

from .common import command_main

HELP = "merge a LoRA adapter into a model folder's weights, for good"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="a model folder (ours or Hugging Face; convert a GGUF file first)")
    p.add_argument("adapter", help="the adapter folder (ours or Hugging Face PEFT)")
    p.add_argument("--out", required=True, help="the model folder to write")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    p.add_argument(
        "--ungated",
        action="store_true",
        help="merge an adapter whose lessons are gated (ruvllm adapt's) without its gates: its rows then "
        "answer every input (docs/learning.md, Locality)",
    )


def run(args: argparse.Namespace) -> int:
    from ..tools.merge import merge_adapter

    merge_adapter(args.model, args.adapter, args.out, force=args.force, log=print, ungated=args.ungated)
    print(f"merged model written to {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return command_main(__name__, argv)
