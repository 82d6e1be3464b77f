"""`ruvllm list`: the complete models of the cache, then its partial files (`ruvllm download NAME` resumes
or removes them)."""

from __future__ import annotations

import argparse

from .common import command_main

HELP = "the models downloaded into the cache"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """No options."""


def run(args: argparse.Namespace) -> int:
    from ..files.hub import cache_folder, list_cached, list_partial

    models = list_cached() + list_partial()
    if not models:
        print(f"no models in {cache_folder()}")
        return 0
    width = max(len(m.name) for m in models)
    for m in models:
        print(f"{m.name:{width}s}  {m.kind:7s} {m.size / 2**20:9.1f} MiB  {m.path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return command_main(__name__, argv)
