"""One version: the Python package, its wheel inside the npm package, and the npm package agree, and the
npm package supersedes the older, different @ruvector/ruvllm 2.6.2 on the registry."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import ruvllm

ROOT = Path(__file__).resolve().parent.parent


def test_python_and_npm_versions_agree_and_supersede_the_registrys_2_6_2():
    python = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    npm = json.loads((ROOT / "npm" / "package.json").read_text())["version"]
    lock = json.loads((ROOT / "npm" / "package-lock.json").read_text())
    assert python == ruvllm.__version__ == npm == lock["version"] == lock["packages"][""]["version"]
    assert tuple(int(part) for part in npm.split(".")[:3]) >= (3, 0, 0)
