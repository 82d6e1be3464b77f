"""The plain-Python tokenizer (text/pure_tokenizer.py) timed: building it from a tokenizer.json, encoding a
~2k-token text and a ~1k-token chat prompt, cold (a fresh tokenizer, empty cache) and warm (again).

    .venv/bin/python benchmarks/tokenizer_bench.py prepare OUT.json   # the inputs (CPython: GGUFs, templates)
    .venv/bin/python benchmarks/tokenizer_bench.py run OUT.json       # the timings, on this interpreter
    node benchmarks/tokenizer_node.mjs PYODIDE_DIST run OUT.json      # the same timings in Pyodide

`prepare` writes each model's tokenizer.json (SmolLM2's folder, Gemma 3's GGUF as ruvllm builds it), the
text (the README, cut to ~2k tokens) and the chat prompt (rendered with the model's template: Pyodide
need not have jinja2) into one file; `run` needs only the standard library and py_src. With `tokenizers`
installed, `run` also gives its ids and times for comparison. Prints one JSON object per model.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEXT_TOKENS, CHAT_TOKENS = 2000, 1000


def prepare(out: Path) -> None:
    from ruvllm.runtime.assembly import open_gguf
    from ruvllm.text.tokenizer import Tokenizer

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    models = {}
    sources = {
        "smollm2": lambda: (
            json.loads((ROOT / "models/smollm2-135m-instruct/tokenizer.json").read_text(encoding="utf-8")),
            json.loads((ROOT / "models/smollm2-135m-instruct/tokenizer_config.json").read_text(encoding="utf-8")),
        ),
        "gemma3": lambda: open_gguf(str(ROOT / "build/downloads/gemma-3-270m-q4_k_m.gguf")).tokenizer_files()[:2],
    }
    for name, read in sources.items():
        document, config = read()
        tokenizer = Tokenizer(json.dumps(document), config)
        text = _cut(tokenizer, readme, TEXT_TOKENS)
        question = _cut(tokenizer, readme[len(text) // 3 :], CHAT_TOKENS - 60)
        messages = [
            {"role": "system", "content": "You answer questions about the text the user gives."},
            {"role": "user", "content": question},
            {"role": "assistant", "content": "It describes a small LLM engine."},
            {"role": "user", "content": "Which runtimes does it name? Answer in 12 words."},
        ]
        prompt = tokenizer.apply_chat_template(messages)
        models[name] = {"document": document, "text": text, "chat_prompt": prompt}
    gemma = open_gguf(str(ROOT / "build/downloads/gemma-3-270m-q4_k_m.gguf")).metadata
    keys = [k for k in gemma if k.startswith("tokenizer.ggml.") or k == "general.architecture"]
    models["gemma3"]["gguf_metadata"] = {k: gemma[k] for k in keys}
    out.write_text(json.dumps(models, ensure_ascii=False), encoding="utf-8")


def _cut(tokenizer, text: str, tokens: int) -> str:
    """The longest prefix of `text` (whole lines) that encodes to at most `tokens` tokens."""
    lines, kept = text.splitlines(keepends=True), ""
    for line in lines:
        if len(tokenizer.encode(kept + line, add_special_tokens=False)) > tokens:
            break
        kept += line
    return kept


def run(path: Path) -> None:
    from ruvllm.files.gguf_vocab import tokenizer_files
    from ruvllm.text.pure_tokenizer import PureTokenizer

    raw = path.read_text(encoding="utf-8")
    models = json.loads(raw)
    for name, inputs in models.items():
        document_json = json.dumps(inputs["document"])
        started = time.perf_counter()
        document = json.loads(document_json)
        parse_ms = _ms(started)
        started = time.perf_counter()
        tokenizer = PureTokenizer(document)
        build_ms = _ms(started)
        result: dict[str, object] = {"model": name, "json_parse_ms": parse_ms, "build_ms": build_ms}
        if "gguf_metadata" in inputs:  # the whole load from a GGUF: the document, then the tokenizer
            for merges in (True, False):  # merges listed (as for `tokenizers`), or ranked by position
                started = time.perf_counter()
                PureTokenizer(tokenizer_files(inputs["gguf_metadata"], "model.gguf", merges=merges)[0])
                result["from_gguf_ms" if merges else "from_gguf_by_position_ms"] = _ms(started)
        for kind in ("text", "chat_prompt"):
            text = inputs[kind]
            tokenizer.model._cache.clear()  # cold: no piece seen before
            started = time.perf_counter()
            ids = tokenizer.encode(text, add_special_tokens=False)
            result[f"{kind}_tokens"] = len(ids)
            result[f"{kind}_cold_ms"] = _ms(started)
            started = time.perf_counter()
            tokenizer.encode(text, add_special_tokens=False)
            result[f"{kind}_warm_ms"] = _ms(started)
            result[f"{kind}_same_ids_as_tokenizers"] = _reference(document_json, text, ids, result, kind)
        print(json.dumps(result))


def ids(path: Path) -> None:
    """{"documents": {name: tokenizer.json}, "texts": [...]} -> prints {name: [ids of each text, with and
    without special tokens]} (tests/test_pure_tokenizer.py compares Pyodide's with `tokenizers`')."""
    from ruvllm.text.pure_tokenizer import PureTokenizer

    inputs = json.loads(path.read_text(encoding="utf-8"))
    found = {}
    for name, document in inputs["documents"].items():
        tokenizer = PureTokenizer(document, name)
        found[name] = [tokenizer.encode(text, add) for text in inputs["texts"] for add in (True, False)]
    print(json.dumps(found))


def _reference(document_json: str, text: str, ids: list[int], result: dict, kind: str) -> bool | None:
    try:
        import tokenizers
    except ImportError:
        return None
    reference = tokenizers.Tokenizer.from_str(document_json)
    started = time.perf_counter()
    expected = reference.encode(text, add_special_tokens=False).ids
    result[f"{kind}_tokenizers_ms"] = _ms(started)
    return expected == ids


def _ms(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 1)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "py_src"))
    command, file = sys.argv[1], Path(sys.argv[2])
    {"prepare": prepare, "run": run, "ids": ids}[command](file)
