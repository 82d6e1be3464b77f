"""`ruvllm serve MODEL`: an OpenAI-compatible HTTP server (ruvllm.server), every option that can be checked
without the model checked before it loads."""

from __future__ import annotations

import argparse
import sys

from ..errors import InvalidArgumentError
from .common import ADAPTER_HELP, add_load_options, command_main, load_model

HELP = "an OpenAI-compatible HTTP server (needs the serve extra)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: this machine only)")
    p.add_argument("--port", type=int, default=8080, help="port to listen on, 1-65535 (default: 8080)")
    p.add_argument("--max-concurrent", type=int, default=8, help="sequences generated together at most, 1-256")
    p.add_argument("--max-context", type=int, help="positions per sequence (default: --context-length's)")
    p.add_argument("--chat-template", metavar="FILE", help="a Jinja chat template to use (for models that have none)")
    p.add_argument("--adapter", help=ADAPTER_HELP)
    add_load_options(p)


def run(args: argparse.Namespace) -> int:
    import importlib.util

    from ..server import MAX_CONCURRENT, bind, serve

    # Everything that can be checked without the model is, before it loads (which takes a while).
    if not 1 <= args.max_concurrent <= MAX_CONCURRENT:
        raise InvalidArgumentError(f"--max-concurrent must be in [1, {MAX_CONCURRENT}], got {args.max_concurrent}")
    if args.max_context is not None and args.max_context < 1:
        raise InvalidArgumentError(f"--max-context must be >= 1, got {args.max_context}")
    if not all(importlib.util.find_spec(name) for name in ("starlette", "uvicorn")):  # the serve extra
        raise InvalidArgumentError("ruvllm serve needs the serve extra: pip install 'ruvllm[serve]'")
    with bind(args.host, args.port) as sock:  # a bad address, or a port in use, is reported now
        model = load_model(args)
        print(f"ruvllm serve: {model.name} on http://{args.host}:{args.port}/v1", file=sys.stderr)
        serve(model, args.host, args.port, args.max_concurrent, args.max_context, sock=sock)
    return 0


def main(argv: list[str] | None = None) -> int:
    return command_main(__name__, argv)
