"""The `ruvllm` command: convert, info, generate, chat.

Errors a user can cause end the program with exit code 1 (2 for a malformed command line) and one line
on stderr; `--verbose` adds the traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from collections import Counter
from collections.abc import Iterator

from .errors import RuvLLMError

EXIT_ERROR, EXIT_USAGE = 1, 2


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, like every other error of the command."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        sys.exit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ruvllm", description="A small language model engine in pure NumPy.")
    parser.add_argument("--verbose", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("convert", help="convert an HF model folder or a .gguf file into a ruvllm model folder")
    p.add_argument("src", help="Hugging Face model folder or .gguf file")
    p.add_argument("out", help="output folder")
    p.add_argument("--weights", choices=("f32", "f16", "q8", "q4_0", "q4_1"), help="storage format of matrices")

    p = sub.add_parser("info", help="describe a model folder")
    p.add_argument("model")

    for name, text in (("generate", "generate text from a prompt"), ("chat", "interactive chat")):
        p = sub.add_parser(name, help=text)
        p.add_argument("model")
        if name == "generate":
            p.add_argument("--prompt", required=True)
            p.add_argument("--chat", action="store_true", help="apply the model's chat template to the prompt")
            p.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
        p.add_argument("--system", help="system message (default: the chat template's own)")
        p.add_argument("--max-tokens", type=int, default=256)
        p.add_argument("--temperature", type=float, default=0.8)
        p.add_argument("--top-k", type=int, default=40)
        p.add_argument("--top-p", type=float, default=0.95)
        p.add_argument("--min-p", type=float, default=0.05)
        p.add_argument("--repetition-penalty", type=float, default=1.0)
        p.add_argument("--seed", type=int)
        p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
        p.add_argument("--ignore-eos", action="store_true")
        p.add_argument("--context-length", type=int, help="KV cache positions (default: min(model's, 4096))")
    return parser


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


def _fail(args: argparse.Namespace, message: str) -> int:
    if args.verbose:
        traceback.print_exc()
    sys.stderr.write(f"ruvllm {args.command}: error: {message}\n")
    return EXIT_ERROR


def cmd_convert(args: argparse.Namespace) -> int:
    from .convert import convert

    convert(args.src, args.out, args.weights, log=lambda line: print(line, flush=True))
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    from .engine import DEFAULT_MAX_CONTEXT, open_store, read_config
    from .formats import get_format

    config = read_config(args.model)
    store = open_store(args.model, header_only=True)
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
        print(f"storage {fmt:6s} {params[fmt] / 1e6:8.2f}M params  {nbytes[fmt] / 2**20:8.1f} MiB")
    print(f"storage total  {sum(nbytes.values()) / 2**20:.1f} MiB")
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
    from .api import load
    from .generate import GenerationOptions

    GenerationOptions.from_kwargs(**_options(args))  # refuse bad options before the slow load
    return load(args.model, context_length=args.context_length)


def _messages(system: str | None, turns: list[dict]) -> list[dict]:
    return ([{"role": "system", "content": system}] if system is not None else []) + turns


def cmd_generate(args: argparse.Namespace) -> int:
    model = _load(args)
    if args.chat:
        messages = _messages(args.system, [{"role": "user", "content": args.prompt}])
        prompt_ids = model.tokenizer.encode_chat(messages)
    else:
        prompt_ids = model.tokenizer.encode(args.prompt)
    chunks = model.generate(prompt_ids, **_options(args))
    if not args.json:
        _stream(chunks)
        return 0
    text, ids, last = [], [], None
    for last in chunks:
        text.append(last.text)
        ids.append(last.token_id)
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
    print(json.dumps(result, ensure_ascii=False))
    return 0


def _stream(chunks: Iterator) -> None:
    for chunk in chunks:
        sys.stdout.write(chunk.text)
        sys.stdout.flush()
    sys.stdout.write("\n")


CHAT_HELP = "commands: /clear (forget the conversation), /system TEXT, /temp T, /quit"


def cmd_chat(args: argparse.Namespace) -> int:
    from .errors import InvalidArgumentError
    from .generate import GenerationOptions

    model = _load(args)
    options = _options(args)
    system, history = args.system, []
    interactive = sys.stdin.isatty()
    print(f"ruvllm chat - {CHAT_HELP}", file=sys.stderr)
    while True:
        try:
            line = input("> " if interactive else "")
        except EOFError:
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
            else:
                print(f"(unknown command {command}; {CHAT_HELP})", file=sys.stderr)
            continue
        history.append({"role": "user", "content": line})
        reply = []
        try:
            for chunk in model.chat(_messages(system, history), **options):
                reply.append(chunk.text)
                sys.stdout.write(chunk.text)
                sys.stdout.flush()
        except RuvLLMError as e:
            history.pop()
            print(f"\n(error: {e.message}; /clear starts over)", file=sys.stderr)
            continue
        sys.stdout.write("\n")
        history.append({"role": "assistant", "content": "".join(reply)})


COMMANDS = {"convert": cmd_convert, "info": cmd_info, "generate": cmd_generate, "chat": cmd_chat}
