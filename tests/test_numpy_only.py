"""The engine needs NumPy alone (as it will inside Pyodide): loading and generating from token ids must
work with every optional package made unimportable."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from conftest import tiny_model

BLOCKED = ["tokenizers", "jinja2", "safetensors", "gguf", "torch", "transformers", "threadpoolctl"]


def test_engine_runs_with_numpy_only(tmp_path):
    tiny_model("llama", tmp_path)
    script = textwrap.dedent(
        f"""
        import sys

        class Block:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {BLOCKED!r}:
                    raise ImportError("blocked: " + name)

        sys.meta_path.insert(0, Block())
        import ruvllm
        from ruvllm.runtime.engine import load_engine
        from ruvllm.runtime.generate import GenerationOptions, generate_tokens

        engine = load_engine({str(tmp_path)!r})
        options = GenerationOptions(max_tokens=4, sampling=ruvllm.SamplingOptions(seed=1))
        steps = list(generate_tokens(engine, [1, 2, 3], options))
        assert [s.finish_reason for s in steps] == [None, None, None, "length"]
        assert not any(m.split(".")[0] in {BLOCKED!r} for m in sys.modules)
        print("ok")
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
