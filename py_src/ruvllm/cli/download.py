"""`ruvllm download hf:OWNER/REPO[/FILE.gguf]`: a model of the Hugging Face hub fetched into the cache,
its progress on stderr and its path on stdout."""

from __future__ import annotations

import argparse
import sys
import time

from .common import command_main

HELP = "download a model of the Hugging Face hub into the cache"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", help="hf:OWNER/REPO (a model folder) or hf:OWNER/REPO/FILE.gguf; @REVISION after REPO")


def run(args: argparse.Namespace) -> int:
    from ..files.hub import download

    progress = _Progress()
    try:
        path = download(args.name, progress=progress)
    finally:
        progress.finish()
    print(path)
    return 0


class _Progress:
    """Download progress on stderr: a line per file, rewritten in place on a terminal (at most 10 times a second)."""

    def __init__(self) -> None:
        self.live = sys.stderr.isatty()
        self.path, self.line, self.shown = None, "", 0.0

    def __call__(self, path, done: int, total: int | None) -> None:
        size = "?" if total is None else f"{total / 2**20:.1f}"
        if path != self.path:
            self.finish()
            self.path = path
            if not self.live:
                print(f"downloading {path.name} ({size} MiB)", file=sys.stderr, flush=True)
        self.line = f"\r{path.name} {done / 2**20:.1f}/{size} MiB"
        now = time.monotonic()
        if self.live and (done in (0, total) or now - self.shown >= 0.1):
            self.shown = now
            sys.stderr.write(self.line)
            sys.stderr.flush()

    def finish(self) -> None:
        """End the current file's line (on a terminal, with its last count)."""
        if self.live and self.path is not None:
            sys.stderr.write(self.line + "\n")
        self.path = None


def main(argv: list[str] | None = None) -> int:
    return command_main(__name__, argv)
