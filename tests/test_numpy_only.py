"""The engine needs NumPy alone (as it will inside Pyodide): loading and generating from token ids must
work with every optional package made unimportable. So does `ruvllm convert` (README, convert/)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from conftest import numpy_model

BLOCKED = ["tokenizers", "jinja2", "safetensors", "gguf", "torch", "transformers", "threadpoolctl"]
BLOCK = textwrap.dedent(
    f"""
    import sys

    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {BLOCKED!r}:
                raise ImportError("blocked: " + name)

    sys.meta_path.insert(0, Block())
    """
)
DONE = f"assert not any(m.split('.')[0] in {BLOCKED!r} for m in sys.modules)\nprint('ok')\n"


def run_blocked(script: str) -> None:
    """`script` run in a fresh interpreter that cannot import BLOCKED, then a check that nothing did."""
    program = BLOCK + textwrap.dedent(script) + DONE
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_engine_runs_with_numpy_only(tmp_path):
    numpy_model("llama", tmp_path)
    run_blocked(
        f"""
        import ruvllm
        from ruvllm.runtime.assembly import load_engine
        from ruvllm.runtime.generate import GenerationOptions, generate_tokens

        engine = load_engine({str(tmp_path)!r})
        options = GenerationOptions(max_tokens=4, sampling=ruvllm.SamplingOptions(seed=1))
        steps = list(generate_tokens(engine, [1, 2, 3], options))
        assert [s.finish_reason for s in steps] == [None, None, None, "length"]
        """
    )


def test_convert_runs_with_numpy_only(tmp_path):
    numpy_model("llama", tmp_path / "hf")
    out = str(tmp_path / "out")
    run_blocked(
        f"""
        from ruvllm.convert import convert
        from ruvllm.runtime.assembly import load_engine

        convert({str(tmp_path / "hf")!r}, {out!r}, "q4_0")
        assert load_engine({out!r}).config.num_hidden_layers == 2
        """
    )
