"""`ruvllm adapt MODEL --out FOLDER`: teach a LoRA adapter (or an X-LoRA mixture's router) that a
completion follows a prompt, or a file of lessons, and write it."""

from __future__ import annotations

import argparse
import dataclasses
import json

from ..errors import InvalidArgumentError
from ..files.outputs import check_output
from ..learning.learn import ROUTER_LR, ROUTER_STEPS, AdaptOptions, check_reward
from ..learning.lora import DEFAULT_LAYERS, DEFAULT_TARGETS, LoRAConfig
from .common import add_load_options, command_main, load_model, read_text

HELP = "teach a LoRA adapter that a completion follows a prompt (or many lessons)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model")
    p.add_argument("--prompt")
    p.add_argument("--completion")
    p.add_argument(
        "--from-file",
        metavar="FEEDBACK.jsonl",
        help="lessons, one JSON object per line: {prompt or messages, completion, reward}; "
        "reports retention and perplexity drift",
    )
    p.add_argument("--epochs", type=int, default=1, help="with --from-file: passes over the lessons")
    p.add_argument(
        "--eval-file",
        metavar="TEXT",
        help="with --from-file: the text whose perplexity drift is reported (default: the built-in calibration text)",
    )
    p.add_argument("--reward", type=float, default=1.0, help="+1 good (likelier), -1 bad (less likely)")
    p.add_argument(
        "--steps", type=int, help=f"most steps (default: {AdaptOptions.steps}; an X-LoRA router's {ROUTER_STEPS})"
    )
    p.add_argument(
        "--lr", type=float, help=f"step size (default: {AdaptOptions.lr:g}; an X-LoRA router's {ROUTER_LR:g})"
    )
    p.add_argument("--rank", type=int, default=LoRAConfig.rank)
    p.add_argument("--alpha", type=float, help="LoRA alpha (default: 2 x rank)")
    p.add_argument("--targets", default=",".join(DEFAULT_TARGETS), help="comma-separated projections")
    p.add_argument(
        "--layers",
        default=_layers_text(DEFAULT_LAYERS),
        help="comma-separated decoder layers to adapt, negative from the top; 'all' for every layer; "
        "'two-thirds' (the default) for the two from two thirds of the depth",
    )
    p.add_argument("--chat", action="store_true", help="the prompt is a user message, the completion the reply")
    p.add_argument(
        "--adapter",
        help="adapter folder to continue from (its rank and targets are kept); an X-LoRA mixture: its router learns",
    )
    p.add_argument("--out", required=True, help="adapter folder to write (new or empty)")
    p.add_argument("--force", action="store_true", help="replace --out (and everything in it) if it is not empty")
    p.add_argument("--json", action="store_true")
    add_load_options(p)


def run(args: argparse.Namespace) -> int:
    lr = AdaptOptions.lr if args.lr is None else args.lr
    steps = AdaptOptions.steps if args.steps is None else args.steps
    options = AdaptOptions(steps=steps, lr=lr)  # bad values are refused before the slow load
    check_reward(args.reward, "--reward")
    lessons = None
    if args.from_file:
        if args.prompt is not None or args.completion is not None:
            raise InvalidArgumentError("give --from-file or --prompt and --completion, not both")
        from ..tools.lessons import read_lessons

        lessons = read_lessons(read_text(args.from_file, "--from-file"), args.from_file)
        eval_text = read_text(args.eval_file, "--eval-file") if args.eval_file else None
    elif args.prompt is None or args.completion is None:
        raise InvalidArgumentError("adapt needs --prompt and --completion, or --from-file")
    inputs = (args.model, args.adapter, args.from_file, args.eval_file)
    check_output(args.out, args.force, inputs, "--out")  # before the slow load and the lessons
    targets = tuple(t.strip() for t in args.targets.split(",") if t.strip())
    config = LoRAConfig(rank=args.rank, alpha=args.alpha, targets=targets, layers=_parse_layers(args.layers))
    model = load_model(args)  # with --adapter, that adapter learns further
    if not args.adapter:
        model.adapters.create("default", config)
    name = model.adapters.active
    if name in model.adapters.mixtures:  # an X-LoRA mixture: its router learns
        lr = ROUTER_LR if args.lr is None else args.lr
        steps = ROUTER_STEPS if args.steps is None else args.steps
        options = dataclasses.replace(options, lr=lr, steps=steps)
    if lessons is not None:
        from ..api import calibration_text
        from ..tools.lessons import run_lessons

        report = run_lessons(model, lessons, name, options, args.epochs, eval_text or calibration_text())
        model.save_adapter(args.out, name, force=args.force, inputs=inputs)
        if args.json:
            print(json.dumps({**report, "out": args.out}))
        else:
            kept, drift = report["retention"], report["perplexity"]
            print(
                f"{len(lessons)} lessons x {args.epochs} epochs ({report['steps']} steps): {kept['reproduced']} of "
                f"{kept['of']} rewarded completions reproduced by greedy decoding; perplexity "
                f"{drift['before']:.3f} -> {drift['after']:.3f} ({drift['change']:+.1%}); adapter written to {args.out}"
            )
        return 0
    report = model.adapt(args.prompt, args.completion, args.reward, name, args.chat, steps=options.steps, lr=options.lr)
    model.save_adapter(args.out, name, force=args.force, inputs=inputs)
    if args.json:
        print(json.dumps({**dataclasses.asdict(report), "out": args.out}))
    else:
        print(f"{report.summary} Adapter written to {args.out}")
    return 0


def _layers_text(layers: tuple[int, ...] | str | None) -> str:
    return "all" if layers is None else layers if isinstance(layers, str) else ",".join(str(i) for i in layers)


def _parse_layers(text: str) -> tuple[int, ...] | str | None:
    if text.strip() == "all":
        return None
    if text.strip() == "two-thirds":
        return "two-thirds"
    try:
        return tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise InvalidArgumentError(
            f"--layers must be layer indexes separated by commas, two-thirds or all; got {text!r}"
        ) from None


def main(argv: list[str] | None = None) -> int:
    return command_main(__name__, argv)
