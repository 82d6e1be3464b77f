"""`ruvllm adapters MODEL FOLDER...`: adapter folders described as the model would hold them."""

from __future__ import annotations

import argparse
import json

from .common import add_load_options, command_main, load_model

HELP = "describe adapter folders (LoRA or X-LoRA) as the model would hold them"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model")
    p.add_argument("folders", nargs="+", help="adapter folders")
    p.add_argument("--json", action="store_true")
    add_load_options(p)


def run(args: argparse.Namespace) -> int:
    model = load_model(args)
    for folder in args.folders:
        model.load_adapter(folder)
    entries = model.list_adapters()
    if args.json:
        print(json.dumps(entries))
        return 0
    for e in entries:
        if e["kind"] == "lora":
            layers = "all" if e["layers"] is None else ",".join(map(str, e["layers"]))
            shape = f"rank {e['rank']}, alpha {e['alpha']:g}, {','.join(e['targets'])}, layers {layers}"
        else:
            routing = "all, weighted" if e["top_k"] is None else f"top {e['top_k']}"
            shape = f"experts {', '.join(e['experts'])}; each token uses {routing}; router depth {e['depth']}"
        print(f"{e['name']}: {e['kind']} (version {e['version']}): {shape}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return command_main(__name__, argv)
