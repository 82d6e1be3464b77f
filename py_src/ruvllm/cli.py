"""The `ruvllm` command: convert, info, generate, chat, perplexity, bench, adapt, merge, mix, adapters,
download, list, serve.

Defaults are the library's own (the option dataclasses), read here, not typed again. Errors a user
can cause end the program with exit code 1 (2 for a malformed command line) and one line on stderr;
`--verbose` adds the traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
import traceback
from collections import Counter
from collections.abc import Iterator

from . import __version__
from .errors import InvalidArgumentError, RuvLLMError
from .files.outputs import check_output
from .learning.learn import ROUTER_LR, AdaptOptions, check_reward
from .learning.lora import DEFAULT_LAYERS, DEFAULT_TARGETS, LoRAConfig
from .learning.xlora import RouterConfig
from .model.cache import COLD_FORMATS, KVOptions
from .model.weights import COMPUTE_FORMS
from .runtime.engine import LoadOptions
from .runtime.generate import GenerationOptions
from .runtime.sampling import SamplingOptions

EXIT_ERROR, EXIT_USAGE = 1, 2
ADAPTER_HELP = "adapter folder to apply: LoRA (ours or Hugging Face PEFT) or an X-LoRA mixture (PEFT's layout)"


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, like every other error of the command."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        sys.exit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ruvllm", description="A small language model engine in pure NumPy.")
    parser.add_argument("--verbose", action="store_true", help="show tracebacks on errors")
    parser.add_argument("--version", action="version", version=f"ruvllm {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("convert", help="convert an HF model folder or a .gguf file into a ruvllm model folder")
    p.add_argument("src", help="Hugging Face model folder or .gguf file")
    p.add_argument("out", help="output folder")
    p.add_argument("--weights", choices=("f32", "f16", "q8", "q4_0", "q4_1"), help="storage format of matrices")
    p.add_argument("--force", action="store_true", help="replace OUT (and everything in it) if it is not empty")

    p = sub.add_parser("info", help="describe a model (folder or GGUF) and the memory it will take")
    p.add_argument("model")
    add_load_options(p)

    p = sub.add_parser("perplexity", help="perplexity of the model on a text file")
    p.add_argument("model")
    p.add_argument("--text-file", required=True)
    p.add_argument("--window", type=int, help="tokens per evaluation window (default: the context length)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--adapter", help=ADAPTER_HELP)
    add_load_options(p)

    p = sub.add_parser("bench", help="prefill, time to first token, decode speed and memory")
    p.add_argument("model")
    p.add_argument("--prompt-length", type=int, default=128)
    p.add_argument("--gen-length", type=int, default=64)
    p.add_argument("--format", choices=("table", "json", "csv"), default="table")
    add_load_options(p)

    p = sub.add_parser("adapt", help="teach a LoRA adapter that a completion follows a prompt (or many lessons)")
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
    p.add_argument("--steps", type=int, default=AdaptOptions.steps)
    p.add_argument(
        "--lr", type=float, help=f"step size (default: {AdaptOptions.lr:g}; an X-LoRA router's {ROUTER_LR:g})"
    )
    p.add_argument("--rank", type=int, default=LoRAConfig.rank)
    p.add_argument("--alpha", type=float, help="LoRA alpha (default: 2 x rank)")
    p.add_argument("--targets", default=",".join(DEFAULT_TARGETS), help="comma-separated projections")
    p.add_argument(
        "--layers",
        default=_layers_text(DEFAULT_LAYERS),
        help="comma-separated decoder layers to adapt, negative from the top; 'all' for every layer",
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

    p = sub.add_parser("merge", help="merge a LoRA adapter into a model folder's weights, for good")
    p.add_argument("model", help="a model folder (ours or Hugging Face; convert a GGUF file first)")
    p.add_argument("adapter", help="the adapter folder (ours or Hugging Face PEFT)")
    p.add_argument("--out", required=True, help="the model folder to write")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")

    p = sub.add_parser(
        "mix", help="compose LoRA adapters into an X-LoRA mixture, routed per token (its router starts out even)"
    )
    p.add_argument("model")
    p.add_argument("experts", nargs="+", help="LoRA adapter folders (ours or Hugging Face PEFT): the experts")
    p.add_argument("--out", required=True, help="the X-LoRA folder to write (PEFT's layout; new or empty)")
    p.add_argument("--force", action="store_true", help="replace --out (and everything in it) if it is not empty")
    p.add_argument("--top-k", type=int, help="experts each token uses (default: all of them, weighted)")
    p.add_argument("--depth", type=int, default=RouterConfig.depth, help="router layers")
    p.add_argument("--size", type=int, default=RouterConfig.size, help="router width when --depth > 1")
    p.add_argument("--layerwise", action="store_true", help="scalings per adapted projection, not one set")
    add_load_options(p)

    p = sub.add_parser("adapters", help="describe adapter folders (LoRA or X-LoRA) as the model would hold them")
    p.add_argument("model")
    p.add_argument("folders", nargs="+", help="adapter folders")
    p.add_argument("--json", action="store_true")
    add_load_options(p)

    p = sub.add_parser("download", help="download a model of the Hugging Face hub into the cache")
    p.add_argument("name", help="hf:OWNER/REPO (a model folder) or hf:OWNER/REPO/FILE.gguf; @REVISION after REPO")

    sub.add_parser("list", help="the models downloaded into the cache")

    p = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (needs the serve extra)")
    p.add_argument("model")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: this machine only)")
    p.add_argument("--port", type=int, default=8080, help="port to listen on, 1-65535 (default: 8080)")
    p.add_argument("--max-concurrent", type=int, default=8, help="sequences generated together at most, 1-256")
    p.add_argument("--max-context", type=int, help="positions per sequence (default: --context-length's)")
    p.add_argument("--chat-template", metavar="FILE", help="a Jinja chat template to use (for models that have none)")
    p.add_argument("--adapter", help=ADAPTER_HELP)
    add_load_options(p)

    for name, text in (("generate", "generate text from a prompt"), ("chat", "interactive chat")):
        p = sub.add_parser(name, help=text)
        p.add_argument("model")
        add_load_options(p)
        p.add_argument("--adapter", help=ADAPTER_HELP)
        if name == "generate":
            p.add_argument("--prompt", required=True)
            p.add_argument("--chat", action="store_true", help="apply the model's chat template to the prompt")
            p.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
            p.add_argument(
                "--logprobs",
                type=int,
                metavar="K",
                help="with --json: each token's log-probability and the K likeliest alternatives",
            )
        p.add_argument("--system", help="system message (default: the chat template's own)")
        p.add_argument(
            "--chat-template", metavar="FILE", help="a Jinja chat template to use (for models that have none)"
        )
        p.add_argument("--max-tokens", type=int, default=GenerationOptions.max_tokens)
        p.add_argument("--temperature", type=float, default=SamplingOptions.temperature)
        p.add_argument("--top-k", type=int, default=SamplingOptions.top_k)
        p.add_argument("--top-p", type=float, default=SamplingOptions.top_p)
        p.add_argument("--min-p", type=float, default=SamplingOptions.min_p)
        p.add_argument("--repetition-penalty", type=float, default=SamplingOptions.repetition_penalty)
        p.add_argument("--seed", type=int)
        p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
        p.add_argument("--ignore-eos", action="store_true")
    return parser


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


def load_options(args: argparse.Namespace) -> LoadOptions:
    kv = KVOptions(hot_tokens=args.hot_tokens, cold=args.cold, budget_bytes=args.kv_budget, keep=args.keep)
    return LoadOptions(
        context_length=args.context_length,
        compute=args.compute,
        memory_budget=args.memory_budget,
        kv=kv,
        isq=args.isq,
        isq_format=args.isq_format,
        threads=args.threads,
    )


def _load_model(args: argparse.Namespace):
    """The model with the command's load options, and its --adapter (if the command has one) active."""
    from .api import load

    o = load_options(args)
    template = None
    if getattr(args, "chat_template", None):
        template = _read_text(args.chat_template, "--chat-template", TEMPLATE_LIMIT)
    model = load(
        args.model,
        o.context_length,
        o.compute,
        o.memory_budget,
        o.kv,
        o.isq,
        o.isq_format,
        o.threads,
        chat_template=template,
    )
    if getattr(args, "adapter", None):
        model.set_adapter(model.load_adapter(args.adapter))
    return model


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
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


def cmd_convert(args: argparse.Namespace) -> int:
    from .convert import convert

    convert(args.src, args.out, args.weights, log=lambda line: print(line, flush=True), force=args.force)
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    import warnings

    from .files.formats import get_format
    from .runtime.engine import DEFAULT_MAX_CONTEXT, open_model, plan_for

    if args.model.startswith("hf:"):
        from .files.hub import ensure_local

        args.model = ensure_local(args.model)
    with warnings.catch_warnings(record=True) as notes:  # what a load would warn about, listed below
        warnings.simplefilter("always")
        config, store = open_model(args.model, header_only=True)
        plan = plan_for(config, store, load_options(args))
    params, nbytes = Counter(), Counter()
    for t in store.tensors.values():
        params[t.format] += _numel(t.shape)
        nbytes[t.format] += get_format(t.format).nbytes(t.shape)
    total = sum(params.values())
    c = config
    print(f"architecture   {c.architecture}")
    print(f"parameters     {total / 1e6:.1f}M ({total:,})")
    print(
        f"shape          {c.num_hidden_layers} layers, hidden {c.hidden_size}, {c.num_attention_heads} heads "
        f"({c.num_key_value_heads} key/value) of {c.head_dim}, MLP {c.intermediate_size}, vocab {c.vocab_size}"
    )
    cache_default = min(c.max_position_embeddings, DEFAULT_MAX_CONTEXT)
    print(f"context        {c.max_position_embeddings} positions (cache default {cache_default})")
    print(f"embeddings     {'tied to the output' if c.tie_word_embeddings else 'separate output matrix'}")
    for fmt in sorted(params, key=lambda f: -nbytes[f]):
        print(f"storage {fmt:10s} {params[fmt] / 1e6:8.2f}M params  {nbytes[fmt] / 2**20:8.1f} MiB")
    print(f"storage total  {sum(nbytes.values()) / 2**20:.1f} MiB")
    print(f"memory plan    compute {plan.compute}: {plan.describe()}")
    stored, held = sum(nbytes.values()), plan.weight_bytes
    if abs(held - stored) > 0.01 * stored:
        if plan.compute == "f32":
            why = "compute f32 holds every weight as float32, the fastest on CPython (--compute q8 or q4: smaller)"
        elif held > stored:
            why = (
                "the compute forms keep each group's scale (and minimum) as float32 where the file has float16, "
                "and unpack formats the kernels cannot read as stored"
            )
        else:
            why = f"the weights are requantized into the smaller compute form {plan.compute}"
        print(f"in memory      weights {held / 2**20:.1f} MiB for {stored / 2**20:.1f} MiB stored: {why}")
    for note in dict.fromkeys(str(n.message) for n in notes):
        print(f"warning        {note}")
    return 0


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _options(args: argparse.Namespace) -> dict:
    return {
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "top_k": args.top_k,
        "top_p": args.top_p,
        "min_p": args.min_p,
        "repetition_penalty": args.repetition_penalty,
        "seed": args.seed,
        "stop": args.stop,
        "ignore_eos": args.ignore_eos,
    }


def _load(args: argparse.Namespace):

    GenerationOptions.from_kwargs(**_options(args))  # refuse bad options before the slow load
    return _load_model(args)


def cmd_perplexity(args: argparse.Namespace) -> int:
    from .tools.perplexity import check_window, perplexity

    if args.window is not None:
        check_window(args.window)  # before the slow load
    text = _read_text(args.text_file, "--text-file")
    o = load_options(args)
    model = _load_model(args)
    engine = model.engine
    result = perplexity(engine, model.tokenizer.encode(text), args.window)
    report = {
        "perplexity": result.perplexity,
        "nll": result.nll,
        "tokens": result.tokens,
        "windows": result.windows,
        "compute": engine.plan.compute,
        "isq": o.isq,
        "kv": {"hot_tokens": o.kv.hot_tokens, "cold": o.kv.cold if o.kv.hot_tokens else None},
    }
    if args.json:
        print(json.dumps(report))
    else:
        where = f"{result.windows} windows, compute {engine.plan.compute}"
        print(f"perplexity {result.perplexity:.4f} over {result.tokens} tokens ({where})")
    return 0


BENCH_COLUMNS = (
    "compute",
    "prompt_tokens",
    "generated_tokens",
    "prefill_ms",
    "ttft_ms",
    "decode_tok_s",
    "peak_rss_bytes",
    "weight_bytes",
    "kv_hot_bytes",
    "kv_cold_bytes",
    "kv_cold_format",
)


def cmd_bench(args: argparse.Namespace) -> int:
    from .api import calibration_text
    from .errors import InvalidArgumentError
    from .tools.bench import run_bench

    if args.prompt_length < 1 or args.gen_length < 1:
        raise InvalidArgumentError("--prompt-length and --gen-length must be >= 1")
    _check_bench_lengths(args)  # before the slow load: the header tells the context
    model = _load_model(args)
    ids = model.tokenizer.encode(calibration_text())
    while len(ids) < args.prompt_length:
        ids = ids + ids
    result = run_bench(model.engine, ids[: args.prompt_length], args.gen_length)
    if args.format == "json":
        print(json.dumps(result))
    elif args.format == "csv":
        print(",".join(BENCH_COLUMNS))
        print(",".join("" if result[c] is None else str(result[c]) for c in BENCH_COLUMNS))
    else:
        for key in BENCH_COLUMNS:
            value = result[key]
            shown = f"{value:.2f}" if isinstance(value, float) else ("-" if value is None else str(value))
            if key.endswith("_bytes") and isinstance(value, int):
                shown = f"{value / 2**20:.1f} MiB"
            print(f"{key:18s} {shown}")
    return 0


def _check_bench_lengths(args: argparse.Namespace) -> None:
    """The prompt and the generated tokens must fit the context the model will be loaded with."""
    from .runtime.engine import open_model, resolve_context

    if args.model.startswith("hf:"):
        from .files.hub import ensure_local

        args.model = ensure_local(args.model)
    config, _ = open_model(args.model, header_only=True)
    context = resolve_context(config, args.context_length)
    needed = args.prompt_length + args.gen_length
    if needed > context:
        most = config.max_position_embeddings
        where = "--context-length" if args.context_length else "the default context (--context-length)"
        raise InvalidArgumentError(
            f"--prompt-length {args.prompt_length} + --gen-length {args.gen_length} need {needed} positions, "
            f"more than {where} of {context}; this model takes at most {most}"
        )


def _messages(system: str | None, turns: list[dict]) -> list[dict]:
    return ([{"role": "system", "content": system}] if system is not None else []) + turns


def cmd_generate(args: argparse.Namespace) -> int:
    model = _load(args)
    if args.chat:
        messages = _messages(args.system, [{"role": "user", "content": args.prompt}])
        prompt_ids = model.tokenizer.encode_chat(messages)
    else:
        prompt_ids = model.tokenizer.encode(args.prompt)
    if args.logprobs is not None and not args.json:
        raise InvalidArgumentError("--logprobs needs --json (the figures are part of the JSON object)")
    chunks = model.generate(prompt_ids, **_options(args), logprobs=args.logprobs)
    if not args.json:
        _stream(chunks)
        return 0
    text, ids, logprobs, last = [], [], [], None
    token = model.tokenizer.token_bytes
    for last in chunks:
        text.append(last.text)
        ids.append(last.token_id)
        if last.logprob is not None:
            top = [
                {"token": token[t].decode("utf-8", "replace"), "id": t, "logprob": lp} for t, lp in last.top_logprobs
            ]
            piece = token[last.token_id].decode("utf-8", "replace")
            logprobs.append({"token": piece, "id": last.token_id, "logprob": last.logprob, "top_logprobs": top})
    result = {
        "text": "".join(text),
        "token_ids": ids,
        "prompt_token_ids": prompt_ids,
        "finish_reason": last.finish_reason,
        "stats": {
            k: getattr(last.stats, k)
            for k in ("prompt_tokens", "completion_tokens", "prefill_ms", "ttft_ms", "decode_tok_s")
        },
    }
    if args.logprobs is not None:
        result["logprobs"] = {"content": logprobs}  # OpenAI's chat layout, with token ids
    print(json.dumps(result, ensure_ascii=False))
    return 0


def _stream(chunks: Iterator) -> None:
    for chunk in chunks:
        sys.stdout.write(chunk.text)
        sys.stdout.flush()
    sys.stdout.write("\n")


CHAT_HELP = "commands: /clear (forget the conversation), /system TEXT, /temp T, /stats (speed on/off), /quit"


def cmd_chat(args: argparse.Namespace) -> int:
    """An interactive chat. On a terminal: line editing and history (readline), Ctrl+C stops the answer
    being written (what it wrote stays in the conversation) and, at the prompt, leaves, as llama.cpp's."""
    from .errors import InvalidArgumentError

    model = _load(args)
    options = _options(args)
    system, history, stats = args.system, [], False
    interactive = sys.stdin.isatty()
    if interactive:
        try:
            import readline  # noqa: F401  (input() edits lines and recalls them once it is imported)
        except ImportError:  # (Windows, Pyodide)
            pass
    print(f"ruvllm chat - {CHAT_HELP}; Ctrl+C stops an answer", file=sys.stderr)
    while True:
        try:
            line = input("> " if interactive else "")
        except (EOFError, KeyboardInterrupt):
            print(file=sys.stderr)
            return 0
        if not line.strip():
            continue
        if line.startswith("/"):
            command, _, value = line.strip().partition(" ")
            if command == "/quit":
                return 0
            if command == "/clear":
                history = []
                print("(conversation cleared)", file=sys.stderr)
            elif command == "/system":
                system = value or None
                print(f"(system message {'set' if system else 'removed'})", file=sys.stderr)
            elif command == "/temp":
                try:
                    GenerationOptions.from_kwargs(**{**options, "temperature": float(value)})
                    options = {**options, "temperature": float(value)}
                    print(f"(temperature {options['temperature']})", file=sys.stderr)
                except (ValueError, InvalidArgumentError) as e:
                    print(f"(not a valid temperature: {e})", file=sys.stderr)
            elif command == "/stats":
                stats = not stats
                print(f"(speed after each answer {'on' if stats else 'off'})", file=sys.stderr)
            else:
                print(f"(unknown command {command}; {CHAT_HELP})", file=sys.stderr)
            continue
        history.append({"role": "user", "content": line})
        reply, last, stopped = [], None, False
        chunks = None
        try:
            chunks = model.chat(_messages(system, history), **options)
            for last in chunks:
                reply.append(last.text)
                sys.stdout.write(last.text)
                sys.stdout.flush()
        except KeyboardInterrupt:
            stopped = True
        except RuvLLMError as e:
            history.pop()
            print(f"\n(error: {e.message}; /clear starts over)", file=sys.stderr)
            continue
        finally:
            if chunks is not None:
                chunks.close()  # the generation ends here (and hands its cache back)
        sys.stdout.write("\n")
        if stopped:
            print("(stopped)", file=sys.stderr)
        if stats and last is not None:
            s = last.stats
            print(
                f"({s.completion_tokens} tokens, {s.decode_tok_s:.1f} tok/s; prompt {s.prompt_tokens} tokens, "
                f"first token after {s.ttft_ms:.0f} ms)",
                file=sys.stderr,
            )
        history.append({"role": "assistant", "content": "".join(reply)})


def cmd_adapt(args: argparse.Namespace) -> int:
    lr = AdaptOptions.lr if args.lr is None else args.lr
    options = AdaptOptions(steps=args.steps, lr=lr)  # bad values are refused before the slow load
    check_reward(args.reward, "--reward")
    lessons = None
    if args.from_file:
        if args.prompt is not None or args.completion is not None:
            raise InvalidArgumentError("give --from-file or --prompt and --completion, not both")
        from .tools.lessons import read_lessons

        lessons = read_lessons(_read_text(args.from_file, "--from-file"), args.from_file)
        eval_text = _read_text(args.eval_file, "--eval-file") if args.eval_file else None
    elif args.prompt is None or args.completion is None:
        raise InvalidArgumentError("adapt needs --prompt and --completion, or --from-file")
    inputs = (args.model, args.adapter, args.from_file, args.eval_file)
    check_output(args.out, args.force, inputs, "--out")  # before the slow load and the lessons
    targets = tuple(t.strip() for t in args.targets.split(",") if t.strip())
    config = LoRAConfig(rank=args.rank, alpha=args.alpha, targets=targets, layers=_parse_layers(args.layers))
    model = _load_model(args)  # with --adapter, that adapter learns further
    if not args.adapter:
        model.adapters.create("default", config)
    name = model.adapters.active
    if args.lr is None and name in model.adapters.mixtures:  # an X-LoRA mixture: its router learns
        options = dataclasses.replace(options, lr=ROUTER_LR)
    if lessons is not None:
        from .api import calibration_text
        from .tools.lessons import run_lessons

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
        print(
            f"mean log-probability of the completion {report.log_prob_before:.3f} -> {report.log_prob_after:.3f} "
            f"in {report.steps} steps ({report.step_ms:.0f} ms each); adapter written to {args.out}"
        )
    return 0


def cmd_mix(args: argparse.Namespace) -> int:
    RouterConfig(depth=args.depth, size=args.size, top_k=args.top_k)  # refuse bad values before the slow load
    inputs = (args.model, *args.experts)
    check_output(args.out, args.force, inputs, "--out")
    model = _load_model(args)
    names = [model.load_adapter(folder) for folder in args.experts]
    if len(set(names)) != len(names):
        raise InvalidArgumentError(f"experts need distinct folder names (they name the experts), got {names}")
    name = "+".join(names)
    model.mix_adapters(name, names, top_k=args.top_k, depth=args.depth, size=args.size, layerwise=args.layerwise)
    model.save_adapter(args.out, name, force=args.force, inputs=inputs)
    print(f"X-LoRA mixture of {', '.join(names)} written to {args.out}")
    return 0


def cmd_adapters(args: argparse.Namespace) -> int:
    model = _load_model(args)
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


def cmd_merge(args: argparse.Namespace) -> int:
    from .tools.merge import merge_adapter

    merge_adapter(args.model, args.adapter, args.out, force=args.force, log=print)
    print(f"merged model written to {args.out}")
    return 0


TEXT_LIMIT = 64 * 2**20  # a text file an option names: far more than any evaluation text or lesson file
TEMPLATE_LIMIT = 2**20  # a chat template: published ones take a few KB (the longest, tens of KB)


def _read_text(path: str, option: str, limit: int = TEXT_LIMIT) -> str:
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


def _layers_text(layers: tuple[int, ...] | None) -> str:
    return "all" if layers is None else ",".join(str(i) for i in layers)


def _parse_layers(text: str) -> tuple[int, ...] | None:
    if text.strip() == "all":
        return None
    try:
        return tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise InvalidArgumentError(
            f"--layers must be layer indexes separated by commas, or all; got {text!r}"
        ) from None


def cmd_download(args: argparse.Namespace) -> int:
    from .files.hub import download

    progress = _DownloadProgress()
    try:
        path = download(args.name, progress=progress)
    finally:
        progress.finish()
    print(path)
    return 0


class _DownloadProgress:
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


def cmd_list(args: argparse.Namespace) -> int:
    """The complete models of the cache, then its partial files (`ruvllm download NAME` resumes or removes them)."""
    from .files.hub import cache_folder, list_cached, list_partial

    models = list_cached() + list_partial()
    if not models:
        print(f"no models in {cache_folder()}")
        return 0
    width = max(len(m.name) for m in models)
    for m in models:
        print(f"{m.name:{width}s}  {m.kind:7s} {m.size / 2**20:9.1f} MiB  {m.path}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    import importlib.util

    from .server import MAX_CONCURRENT, bind, serve

    # Everything that can be checked without the model is, before it loads (which takes a while).
    if not 1 <= args.max_concurrent <= MAX_CONCURRENT:
        raise InvalidArgumentError(f"--max-concurrent must be in [1, {MAX_CONCURRENT}], got {args.max_concurrent}")
    if args.max_context is not None and args.max_context < 1:
        raise InvalidArgumentError(f"--max-context must be >= 1, got {args.max_context}")
    if not all(importlib.util.find_spec(name) for name in ("starlette", "uvicorn")):  # the serve extra
        raise InvalidArgumentError("ruvllm serve needs the serve extra: pip install 'ruvllm[serve]'")
    with bind(args.host, args.port) as sock:  # a bad address, or a port in use, is reported now
        model = _load_model(args)
        print(f"ruvllm serve: {model.name} on http://{args.host}:{args.port}/v1", file=sys.stderr)
        serve(model, args.host, args.port, args.max_concurrent, args.max_context, sock=sock)
    return 0


COMMANDS = {
    "serve": cmd_serve,
    "adapt": cmd_adapt,
    "merge": cmd_merge,
    "mix": cmd_mix,
    "adapters": cmd_adapters,
    "convert": cmd_convert,
    "info": cmd_info,
    "generate": cmd_generate,
    "chat": cmd_chat,
    "perplexity": cmd_perplexity,
    "bench": cmd_bench,
    "download": cmd_download,
    "list": cmd_list,
}
