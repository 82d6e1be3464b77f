"""The `ruvllm` command: a dispatcher over one module per command (ruvllm.cli.NAME, as mlx-lm's
mlx_lm.NAME), each with its help line `HELP`, its options `add_arguments(parser)`, its body `run(args)`
and `main(argv)` (the command alone: `ruvllm.cli.info.main(["model"])` is `ruvllm info model`). What they
share (load options, exit codes, the --verbose traceback rule, bounded reads of files) is ruvllm.cli.common.

Defaults are the library's own (the option dataclasses), read there, not typed again. Errors a user can
cause end the program with exit code 1 (2 for a malformed command line) and one line on stderr;
`--verbose` adds the traceback.
"""

from __future__ import annotations

import argparse
import importlib
from types import ModuleType

from .. import __version__
from .common import Parser, run

# In the order `ruvllm --help` lists them.
COMMANDS = (
    "convert",
    "info",
    "perplexity",
    "bench",
    "adapt",
    "merge",
    "mix",
    "adapters",
    "download",
    "list",
    "serve",
    "generate",
    "chat",
)


def command(name: str) -> ModuleType:
    """The module of the command `name` (ruvllm.cli.list is imported by name: `list` is a builtin)."""
    return importlib.import_module(f"{__name__}.{name}")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="ruvllm", description="A small language model engine in pure NumPy.")
    parser.add_argument("--verbose", action="store_true", help="show tracebacks on errors")
    parser.add_argument("--version", action="version", version=f"ruvllm {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for name in COMMANDS:
        module = command(name)
        module.add_arguments(sub.add_parser(name, help=module.HELP))
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run(command(args.command).run, args)
