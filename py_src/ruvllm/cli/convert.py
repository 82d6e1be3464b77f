"""`ruvllm convert SRC OUT`: a Hugging Face model folder or a GGUF file made into a ruvllm model folder."""

from __future__ import annotations

import argparse

from .common import command_main

HELP = "convert an HF model folder or a .gguf file into a ruvllm model folder"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("src", help="Hugging Face model folder or .gguf file")
    p.add_argument("out", help="output folder")
    p.add_argument("--weights", choices=("f32", "f16", "q8", "q4_0", "q4_1"), help="storage format of matrices")
    p.add_argument("--force", action="store_true", help="replace OUT (and everything in it) if it is not empty")


def run(args: argparse.Namespace) -> int:
    from ..convert import convert

    convert(args.src, args.out, args.weights, log=lambda line: print(line, flush=True), force=args.force)
    return 0


def main(argv: list[str] | None = None) -> int:
    return command_main(__name__, argv)
