"""Samples of public JSON Schema suites (tests/data/schema_suites/): each schema compiles, its valid
instances are accepted byte by byte to the end, and its invalid ones are refused somewhere."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from ruvllm.errors import InvalidArgumentError
from ruvllm.runtime.constrain import Matcher, Vocabulary
from ruvllm.runtime.constrain import json_grammar as compact_grammar

DATA = Path(__file__).parent / "data" / "schema_suites"
BYTES = Vocabulary([b"</s>", *(bytes([b]) for b in range(256))], 257, special_ids=[], eos_ids=[0])


def json_grammar(schema):
    """The instances are written with `json.dumps`' default separators: the flexible form."""
    return compact_grammar(schema, whitespace="flexible")


def load(name: str) -> list[dict]:
    return json.loads((DATA / name).read_text(encoding="utf-8"))


def reads(grammar, data: object) -> bool:
    matcher = Matcher(grammar, BYTES)
    try:
        for b in json.dumps(data, ensure_ascii=False).encode("utf-8"):
            matcher.advance(1 + b)
    except InvalidArgumentError:
        return False
    return matcher.complete


CASES = [(f"{c['file']}: {c.get('description', '')}", c) for name in ("json_schema_test_suite.json", "maskbench.json")
         for c in load(name)]  # fmt: skip


@pytest.mark.parametrize("case", [c for _, c in CASES], ids=[i for i, _ in CASES])
def test_suite_samples_compile_and_judge_their_instances(case):
    grammar = json_grammar(case["schema"])
    for test in case["tests"]:
        assert reads(grammar, test["data"]) == test["valid"], json.dumps(test["data"])[:200]


def test_the_samples_cover_both_suites_and_both_kinds_of_instance():
    suite, maskbench = load("json_schema_test_suite.json"), load("maskbench.json")
    assert len(suite) >= 30 and len(maskbench) >= 24
    assert len({c["file"] for c in suite}) >= 20  # many keywords
    assert len({c["file"].split("---")[0] for c in maskbench}) >= 8  # many datasets
    for cases in (suite, maskbench):
        kinds = [t["valid"] for c in cases for t in c["tests"]]
        assert kinds.count(True) >= 30 and kinds.count(False) >= 30


def test_the_samples_validate_as_jsonschema_says():
    jsonschema = pytest.importorskip("jsonschema")
    for _, case in CASES:
        with warnings.catch_warnings():  # a few name a $schema jsonschema does not know: the latest draft
            warnings.simplefilter("ignore", DeprecationWarning)
            validator = jsonschema.validators.validator_for(case["schema"])(case["schema"])
        for test in case["tests"]:
            if test["valid"]:
                assert validator.is_valid(test["data"]), case["file"]


def test_generations_on_real_schemas_validate(tmp_path, smollm2):
    """A tiny run of `schema_suites.py --generate` (the check issue 27 names, there on 40 schemas x 20):
    a few MaskBench sample schemas, two generations each at temperature 1 on SmolLM2, every finished
    output valid."""
    import random
    import sys

    sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))
    from schema_suites import generations

    folder = tmp_path / "data" / "sample"
    folder.mkdir(parents=True)
    for i, case in enumerate(load("maskbench.json")[:6]):
        (folder / f"{i}.json").write_text(json.dumps(case["schema"]))
    result = generations(tmp_path, 3, 2, 96, random.Random(0), model=smollm2, speed=True)
    assert result["schemas"] == 3 and result.get("finished", 0) >= 1, result
    assert result["failures"] == [] and result["valid"] == result["finished"], result
    assert result["timed tokens"] >= 8 and set(result["seconds"]) == {"constrained", "unconstrained"}, result
    second = generations(tmp_path, 3, 1, 96, random.Random(0), model=smollm2, shard=(1, 2))
    assert second["schemas"] == 1 and second["seconds"] == {}, second  # the 2nd of the 3 schemas only
