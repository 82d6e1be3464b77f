"""`ruvllm generate MODEL --prompt TEXT`: the model's continuation of a prompt, streamed or as one JSON
object. Also the options and the model load it shares with `ruvllm chat`."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator

from ..errors import InvalidArgumentError
from ..runtime.generate import GenerationOptions
from ..runtime.sampling import SamplingOptions
from .common import ADAPTER_HELP, add_load_options, command_main, load_model

HELP = "generate text from a prompt"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model")
    add_load_options(p)
    p.add_argument("--adapter", help=ADAPTER_HELP)
    p.add_argument("--prompt", required=True)
    p.add_argument("--chat", action="store_true", help="apply the model's chat template to the prompt")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    p.add_argument(
        "--logprobs",
        type=int,
        metavar="K",
        help="with --json: each token's log-probability and the K likeliest alternatives",
    )
    add_generation_options(p)


def add_generation_options(p: argparse.ArgumentParser) -> None:
    """The options of generate and chat past the prompt: system message, template, sampling, stops."""
    p.add_argument("--system", help="system message (default: the chat template's own)")
    p.add_argument("--chat-template", metavar="FILE", help="a Jinja chat template to use (for models that have none)")
    p.add_argument("--max-tokens", type=int, default=GenerationOptions.max_tokens)
    p.add_argument("--temperature", type=float, default=SamplingOptions.temperature)
    p.add_argument("--top-k", type=int, default=SamplingOptions.top_k)
    p.add_argument("--top-p", type=float, default=SamplingOptions.top_p)
    p.add_argument("--min-p", type=float, default=SamplingOptions.min_p)
    p.add_argument("--repetition-penalty", type=float, default=SamplingOptions.repetition_penalty)
    p.add_argument("--seed", type=int)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true")


def generation_options(args: argparse.Namespace) -> dict:
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


def load_for_generation(args: argparse.Namespace):
    GenerationOptions.from_kwargs(**generation_options(args))  # refuse bad options before the slow load
    return load_model(args)


def messages(system: str | None, turns: list[dict]) -> list[dict]:
    return ([{"role": "system", "content": system}] if system is not None else []) + turns


def run(args: argparse.Namespace) -> int:
    model = load_for_generation(args)
    if args.chat:
        prompt_ids = model.tokenizer.encode_chat(messages(args.system, [{"role": "user", "content": args.prompt}]))
    else:
        prompt_ids = model.tokenizer.encode(args.prompt)
    if args.logprobs is not None and not args.json:
        raise InvalidArgumentError("--logprobs needs --json (the figures are part of the JSON object)")
    chunks = model.generate(prompt_ids, **generation_options(args), logprobs=args.logprobs)
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
    assert last is not None  # (a generation ends with a chunk that says why)
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


def main(argv: list[str] | None = None) -> int:
    return command_main(__name__, argv)
