"""`ruvllm chat MODEL`: an interactive chat. On a terminal: line editing and history (readline), Ctrl+C
stops the answer being written (what it wrote stays in the conversation); at the prompt it says how to
leave, and a second Ctrl+C in a row leaves (as Node's and Python's shells do, not silently)."""

from __future__ import annotations

import argparse
import sys

from ..errors import InvalidArgumentError, RuvLLMError
from ..runtime.generate import GenerationOptions
from .common import ADAPTER_HELP, add_load_options, command_main
from .generate import add_generation_options, generation_options, load_for_generation, messages

HELP = "interactive chat"
CHAT_HELP = "commands: /help, /clear (forget the conversation), /system TEXT, /temp T, /stats (speed on/off), /quit"
LEAVE = "(to leave: Ctrl+C again, Ctrl+D or /quit)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model")
    add_load_options(p)
    p.add_argument("--adapter", help=ADAPTER_HELP)
    add_generation_options(p)


def run(args: argparse.Namespace) -> int:
    model = load_for_generation(args)
    options = generation_options(args)
    history: list[dict[str, str]] = []  # the chat so far: {"role", "content"} messages
    system, stats = args.system, False
    interactive = sys.stdin.isatty()
    if interactive:
        try:
            import readline  # noqa: F401  (input() edits lines and recalls them once it is imported)
        except ImportError:  # (Windows, Pyodide)
            pass
    print(f"ruvllm chat - {CHAT_HELP}; Ctrl+C stops an answer", file=sys.stderr)
    interrupted = False  # the last thing at the prompt was Ctrl+C
    while True:
        try:
            line = input("> " if interactive else "")
        except EOFError:
            print("(bye)", file=sys.stderr)
            return 0
        except KeyboardInterrupt:
            if interrupted:
                print("\n(bye)", file=sys.stderr)
                return 0
            interrupted = True
            print(f"\n{LEAVE}", file=sys.stderr)
            continue
        interrupted = False
        if not line.strip():
            continue
        if line.startswith("/"):
            command, _, value = line.strip().partition(" ")
            if command == "/quit":
                return 0
            if command == "/help":
                print(f"({CHAT_HELP}; Ctrl+C stops an answer; {LEAVE.strip('()')})", file=sys.stderr)
            elif command == "/clear":
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
            chunks = model.chat(messages(system, history), **options)
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


def main(argv: list[str] | None = None) -> int:
    return command_main(__name__, argv)
