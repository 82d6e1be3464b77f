"""`ruvllm mix MODEL EXPERT... --out FOLDER`: LoRA adapters composed into an X-LoRA mixture."""

from __future__ import annotations

import argparse

from ..errors import InvalidArgumentError
from ..files.outputs import check_output
from ..learning.xlora import RouterConfig
from .common import add_load_options, command_main, load_model

HELP = "compose LoRA adapters into an X-LoRA mixture, routed per token (its router starts out even)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model")
    p.add_argument("experts", nargs="+", help="LoRA adapter folders (ours or Hugging Face PEFT): the experts")
    p.add_argument("--out", required=True, help="the X-LoRA folder to write (PEFT's layout; new or empty)")
    p.add_argument("--force", action="store_true", help="replace --out (and everything in it) if it is not empty")
    p.add_argument("--top-k", type=int, help="experts each token uses (default: all of them, weighted)")
    p.add_argument("--depth", type=int, default=RouterConfig.depth, help="router layers")
    p.add_argument("--size", type=int, default=RouterConfig.size, help="router width when --depth > 1")
    p.add_argument("--layerwise", action="store_true", help="scalings per adapted projection, not one set")
    add_load_options(p)


def run(args: argparse.Namespace) -> int:
    RouterConfig(depth=args.depth, size=args.size, top_k=args.top_k)  # refuse bad values before the slow load
    inputs = (args.model, *args.experts)
    check_output(args.out, args.force, inputs, "--out")
    model = load_model(args)
    names = [model.load_adapter(folder) for folder in args.experts]
    if len(set(names)) != len(names):
        raise InvalidArgumentError(f"experts need distinct folder names (they name the experts), got {names}")
    name = "+".join(names)
    model.mix_adapters(name, names, top_k=args.top_k, depth=args.depth, size=args.size, layerwise=args.layerwise)
    model.save_adapter(args.out, name, force=args.force, inputs=inputs)
    print(f"X-LoRA mixture of {', '.join(names)} written to {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return command_main(__name__, argv)
