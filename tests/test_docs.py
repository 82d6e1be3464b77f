"""The docs say what the code has: the README's layout and the package docstrings list every module
(and nothing that is gone), and docs/serve.md names every metric /metrics exports."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

from ruvllm.server import Service
from test_layers import LAYERS, PACKAGE

ROOT = PACKAGE.parent.parent
SUBPACKAGES = sorted(name for name in LAYERS if (PACKAGE / name / "__init__.py").exists())  # files, quant, ...
NAME = re.compile(r"`(\w+\.py|\w+/)`")  # a module or a package, as the docs write them


def children(package: Path) -> set[str]:
    """`name.py` for each module of `package`, `name/` for each subpackage."""
    modules = {p.name for p in package.glob("*.py") if p.name != "__init__.py"}
    return modules | {p.name + "/" for p in package.iterdir() if (p / "__init__.py").exists()}


def readme_layout() -> str:
    """The README's bullet on py_src/ruvllm/, up to the next top-level bullet."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index("- `py_src/ruvllm/`")
    return text[start : text.index("\n- `", start)]


def sections(layout: str) -> dict[str, str]:
    """The layout cut after each subpackage's first mention and at "entry points": "" holds what comes
    before the first subpackage (errors.py), "entry" the top modules."""
    marks = [(layout.index(f"`{name}/`"), f"`{name}/`", name) for name in SUBPACKAGES if f"`{name}/`" in layout]
    marks = sorted([*marks, (layout.index("entry points"), "entry points", "entry")])
    ends = [at for at, _, _ in marks] + [len(layout)]
    found = {"": layout[: ends[0]]}
    for (at, mark, name), end in zip(marks, ends[1:], strict=True):
        found[name] = layout[at + len(mark) : end]
    return found


def stem(name: str) -> str:
    return name.removesuffix(".py").removesuffix("/")


def test_the_readme_layout_lists_every_subpackages_modules():
    found = sections(readme_layout())
    wrong = {}
    for name in SUBPACKAGES:
        listed = set(NAME.findall(found.get(name, "")))
        if listed != children(PACKAGE / name):
            wrong[name] = {"missing": children(PACKAGE / name) - listed, "gone": listed - children(PACKAGE / name)}
    assert wrong == {}


def test_the_readme_layout_lists_every_top_module():
    """errors.py and the entry points (a top module may become a package: cli.py or cli/ both match)."""
    found = sections(readme_layout())
    listed = {stem(n) for n in NAME.findall(found[""] + found["entry"])}
    top = {stem(n) for n in children(PACKAGE) if stem(n) not in LAYERS} | {"errors"}
    assert listed == top


def test_each_subpackage_docstring_lists_its_modules():
    wrong = {}
    for name in SUBPACKAGES:
        for init in sorted((PACKAGE / name).rglob("__init__.py")):
            listed = set(NAME.findall(ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""))
            if listed != children(init.parent):
                key = str(init.parent.relative_to(PACKAGE))
                wrong[key] = {"missing": children(init.parent) - listed, "gone": listed - children(init.parent)}
    assert wrong == {}


def test_the_package_docstring_names_every_layer_and_entry_point():
    doc = ast.get_docstring(ast.parse((PACKAGE / "__init__.py").read_text(encoding="utf-8")))
    missing = [f"{name}/" for name in SUBPACKAGES if f"{name}/" not in doc]
    entries = {stem(n) for n in children(PACKAGE) if stem(n) not in LAYERS} - {"errors"}
    missing += [name for name in sorted(entries) if not re.search(rf"(?<![\w/]){name}\b", doc)]
    assert missing == []


def emitted_metrics() -> set[str]:
    """The metric names (with their label names) in what /metrics answers."""
    service = Service.__new__(Service)  # the exposition alone: no model, a scheduler that counts nothing
    service.scheduler = SimpleNamespace(stats=lambda: defaultdict(int))
    service.http_requests = {("/health", 200): 1}
    names = set()
    for line in service.metrics().splitlines():
        if not line.startswith("#"):
            metric, _, labels = line.split()[0].partition("{")
            keys = re.findall(r"(\w+)=", labels)
            names.add(metric + ("{" + ",".join(keys) + "}" if keys else ""))
    return names


def test_docs_serve_lists_every_metric_the_server_exports():
    text = (ROOT / "docs" / "serve.md").read_text(encoding="utf-8")
    row = next(line for line in text.splitlines() if line.startswith("| `GET /metrics` |"))
    documented = set(re.findall(r"`(ruvllm_[\w{},]+)`", row))
    assert documented == emitted_metrics()
