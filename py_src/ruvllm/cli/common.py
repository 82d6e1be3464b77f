"""What every `ruvllm` command shares, written once: the one-line parser errors, the exit codes and the
`--verbose` traceback rule, the load options (--compute, --threads, --memory-budget, ...) and the model
they load, and bounded reads of the text files options name.

Errors a user can cause end the program with exit code 1 (2 for a malformed command line) and one line
on stderr; `--verbose` adds the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import math
import sys
import traceback
from collections.abc import Callable

from ..errors import InvalidArgumentError, RuvLLMError
from ..model.cache import COLD_FORMATS, KVOptions
from ..model.weights import COMPUTE_FORMS
from ..quant.provider import ARITHMETIC, DEFAULT_ARITHMETIC, KERNEL_CHOICES
from ..runtime.engine import LoadOptions

EXIT_ERROR, EXIT_USAGE = 1, 2
ADAPTER_HELP = "adapter folder to apply: LoRA (ours or Hugging Face PEFT) or an X-LoRA mixture (PEFT's layout)"


class Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, like every other error of the command."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        sys.exit(EXIT_USAGE)


def run(command: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """`command(args)`, its errors turned into one line on stderr and exit code 1 (the traceback too
    with --verbose)."""
    try:
        return command(args)
    except RuvLLMError as e:
        return _fail(args, e.message)
    except KeyboardInterrupt:
        return 130
    except (OSError, MemoryError) as e:
        return _fail(args, f"{type(e).__name__}: {e}")
    except Exception as e:  # a bug of ours, not the user's input: still one line, the traceback on request
        return _fail(args, f"internal error: {type(e).__name__}: {e} (rerun with --verbose for the traceback)")


def _fail(args: argparse.Namespace, message: str) -> int:
    if args.verbose:
        traceback.print_exc()
    sys.stderr.write(f"ruvllm {args.command}: error: {message}\n")
    return EXIT_ERROR


def command_main(module: str, argv: list[str] | None) -> int:
    """What `ruvllm NAME ARGV...` does, for the command module `module` (ruvllm.cli.NAME) alone: the same
    parser (without the top-level --verbose) and the same errors and exit codes."""
    command = importlib.import_module(module)
    name = module.rpartition(".")[2]
    parser = Parser(prog=f"ruvllm {name}")
    command.add_arguments(parser)
    parser.set_defaults(command=name, verbose=False)
    return run(command.run, parser.parse_args(argv))


def parse_bytes(text: str) -> int:
    """'1073741824', '512M', '512MiB', '1.5G' -> bytes (binary units)."""
    units = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}
    value = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = value[-1] if value and value[-1] in "KMG" else ""
    try:
        number = float(value[: len(value) - len(unit)])
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (use bytes, or a number with K, M or G)") from None
    if not math.isfinite(number) or number <= 0:
        raise argparse.ArgumentTypeError(f"a size must be a positive number of bytes, got {text!r}")
    return int(number * units[unit])


def add_load_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--context-length", type=int, help="KV cache positions (default: min(model's, 4096))")
    p.add_argument("--compute", choices=("auto", *COMPUTE_FORMS), default=LoadOptions.compute, help="weights in memory")
    p.add_argument("--memory-budget", type=parse_bytes, help="bytes for weights + KV cache + workspace (e.g. 512M)")
    p.add_argument("--hot-tokens", type=int, help="newest positions kept in float32; older ones go cold")
    p.add_argument("--cold", choices=tuple(COLD_FORMATS), default=KVOptions.cold, help="storage of cold KV positions")
    p.add_argument("--kv-budget", type=parse_bytes, help="KV cache byte cap; past it old positions are dropped")
    p.add_argument("--keep", type=int, default=KVOptions.keep, help="first positions never dropped (attention sinks)")
    p.add_argument("--isq", choices=("rtn", "awq"), default=LoadOptions.isq, help="quantizing a float model at load")
    p.add_argument(
        "--isq-format", choices=("q4_0", "q4_1"), default=LoadOptions.isq_format, help="4-bit format for --compute q4"
    )
    p.add_argument(
        "--threads",
        type=int,
        help="BLAS threads for prompt processing (default: one or every CPU, whichever measures faster as it "
        "runs; decoding uses one)",
    )
    p.add_argument(
        "--kernels",
        choices=KERNEL_CHOICES,
        default=LoadOptions.kernels,
        help="what computes the matrix products: auto (the WebAssembly kernels in Pyodide, NumPy on CPython), "
        "wasm (the same kernels; on CPython through wasmtime: pip install 'ruvllm[kernels]'; an error where they "
        "cannot run) or numpy",
    )
    p.add_argument(
        "--arithmetic",
        choices=ARITHMETIC,
        default=DEFAULT_ARITHMETIC,
        help="the WebAssembly kernels' arithmetic (docs/kernels.md); NumPy's is exact",
    )
    p.add_argument(
        "--no-plan",
        dest="plan",
        action="store_false",
        help="drive each product from Python instead of running the forward as one call of the kernels' decode "
        "plan (docs/kernels.md)",
    )


def load_options(args: argparse.Namespace) -> LoadOptions:
    """The load options the command's arguments give, with the kernels this runtime offers (in Pyodide,
    the WebAssembly ones)."""
    from ..api import load_options as options_of

    kv = KVOptions(hot_tokens=args.hot_tokens, cold=args.cold, budget_bytes=args.kv_budget, keep=args.keep)
    more = {"isq": args.isq, "isq_format": args.isq_format, "threads": args.threads, "plan": args.plan}
    return options_of(args.context_length, args.compute, args.memory_budget, kv, args.kernels, args.arithmetic, **more)


def load_model(args: argparse.Namespace):
    """The model with the command's load options, and its --adapter (if the command has one) active."""
    from ..api import load

    o = load_options(args)
    template = None
    if getattr(args, "chat_template", None):
        template = read_text(args.chat_template, "--chat-template", TEMPLATE_LIMIT)
    model = load(
        args.model,
        o.context_length,
        o.compute,
        o.memory_budget,
        o.kv,
        o.isq,
        o.isq_format,
        o.threads,
        o.kernels,
        chat_template=template,
        arithmetic=args.arithmetic,
        plan=args.plan,
    )
    if getattr(args, "adapter", None):
        model.set_adapter(model.load_adapter(args.adapter))
    return model


def local_model(args: argparse.Namespace) -> None:
    """An hf:NAME model is fetched into the cache (if it is not there) and args.model becomes its path."""
    from ..files.hub import ensure_local, is_hub_name

    if is_hub_name(args.model):
        args.model = ensure_local(args.model)


TEXT_LIMIT = 64 * 2**20  # a text file an option names: far more than any evaluation text or lesson file
TEMPLATE_LIMIT = 2**20  # a chat template: published ones take a few KB (the longest, tens of KB)


def read_text(path: str, option: str, limit: int = TEXT_LIMIT) -> str:
    """The UTF-8 text of a file an option names, at most `limit` bytes read: an endless or binary file
    (/dev/zero, an image) is a one-line error naming the option, before any model loads."""
    try:
        with open(path, "rb") as f:
            raw = f.read(limit + 1)
    except OSError as e:
        raise InvalidArgumentError(f"{option} {path}: cannot read it ({e.strerror or e})") from None
    if len(raw) > limit:
        raise InvalidArgumentError(f"{option} {path}: the file is larger than {limit // 2**20} MiB, the most it may be")
    if b"\0" in raw:
        raise InvalidArgumentError(f"{option} {path}: not a text file (byte {raw.index(0)} is a NUL)")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidArgumentError(f"{option} {path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
