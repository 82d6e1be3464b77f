"""The layers of the package (its docstring states them): no module imports one of a higher layer, and
the side branches at one level (text, learning, convert) do not import each other. Imports are read
with `ast`, those inside functions included, so a lazy import cannot hide a dependency."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "py_src" / "ruvllm"
LAYERS = {
    "errors": 0,
    "files": 1,
    "quant": 2,
    "model": 3,
    "runtime": 4,
    "text": 5,
    "learning": 5,
    "convert": 5,
    "tools": 6,
    "entry": 7,  # the modules at the top (api, bridge, host, server, session, __init__, __main__), cli/, completions/
}
ENTRY_PACKAGES = {"cli", "completions"}  # subpackages of the entry layer: the `ruvllm` command, OpenAI bodies


def part_of(module: str) -> str:
    """The layer a module belongs to: its subpackage, "errors", or "entry" for the other top modules and
    the entry packages."""
    name = module.split(".")[1] if module.count(".") >= 1 else "__init__"
    return name if name in LAYERS else "entry"


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every ruvllm module `path` imports."""
    module = "ruvllm." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    package = package.removesuffix(".__init__")
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == "ruvllm" or target.startswith("ruvllm."):
                names = [f"{target}.{a.name}" for a in node.names] if target.count(".") <= 1 else [target]
                found += [(node.lineno, name) for name in names]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("ruvllm.")]
    return found


def test_no_module_imports_a_higher_layer_or_a_sibling_branch():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        own = part_of("ruvllm." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts))
        for line, target in imports_of(path):
            other = part_of(target)
            if other != own and LAYERS[other] >= LAYERS[own]:
                wrong.append(f"{path.relative_to(PACKAGE)}:{line} ({own}) imports {target} ({other})")
    assert wrong == []


def test_every_module_has_a_layer():
    parts = {part_of("ruvllm." + ".".join(p.relative_to(PACKAGE).with_suffix("").parts)) for p in PACKAGE.rglob("*.py")}
    assert parts <= set(LAYERS), parts - set(LAYERS)
    assert {p.name for p in PACKAGE.glob("*.py")} == {
        "api.py",
        "bridge.py",
        "errors.py",
        "host.py",
        "__init__.py",
        "__main__.py",
        "server.py",
        "session.py",
    }
    # A new subpackage is given its layer here, not taken for an entry point unseen.
    subpackages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert subpackages == (set(LAYERS) - {"errors", "entry"}) | ENTRY_PACKAGES


def module_of(path: Path) -> str:
    return "ruvllm." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts).removesuffix(".__init__")


def test_no_import_cycle_inside_a_package():
    """Modules of one package (its __init__ aside, which gathers them) import each other one way only:
    a cycle means the two belong in one module, or what both need in a third below them. Lazy imports
    count too (a cycle hidden in a function is still one)."""
    paths = {module_of(p): p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"}
    edges = {}
    for module, path in paths.items():
        package = module.rsplit(".", 1)[0]
        targets = {target for _, target in imports_of(path)}
        edges[module] = {t for t in targets if t in paths and t.rsplit(".", 1)[0] == package and t != module}
    cycles, done = [], set()

    def visit(module: str, trail: list[str]) -> None:
        if module in trail:
            cycles.append(" -> ".join([*trail[trail.index(module) :], module]))
            return
        if module in done:
            return
        for target in sorted(edges[module]):
            visit(target, [*trail, module])
        done.add(module)

    for module in sorted(edges):
        visit(module, [])
    assert cycles == []


def test_only_the_bridge_and_the_host_import_javascript():
    """`js`, `pyodide` and `pyodide_js` exist only inside Pyodide: the rest of the package runs anywhere."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            if any(name.split(".")[0] in ("js", "pyodide", "pyodide_js") for name in names):
                found.append(path.name)
    assert set(found) <= {"bridge.py", "host.py"} and "host.py" in found
