"""`ruvllm info MODEL`: a model's shape, its storage, and the memory a load with these options will take,
read from the header alone (no weight is loaded)."""

from __future__ import annotations

import argparse
from collections import Counter

from .common import add_load_options, command_main, load_options, local_model

HELP = "describe a model (folder or GGUF) and the memory it will take"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model")
    add_load_options(p)


def run(args: argparse.Namespace) -> int:
    import warnings

    from ..files.formats import get_format
    from ..runtime.assembly import open_model
    from ..runtime.engine import DEFAULT_MAX_CONTEXT, plan_for

    local_model(args)
    with warnings.catch_warnings(record=True) as notes:  # what a load would warn about, listed below
        warnings.simplefilter("always")
        config, store = open_model(args.model, header_only=True)
        plan = plan_for(config, store, load_options(args))
    params: Counter[str] = Counter()  # by storage format
    nbytes: Counter[str] = Counter()
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
        print(f"storage {fmt:10s} {params[fmt] / 1e6:8.2f}M params  {nbytes[fmt] / 2**20:8.1f} MiB")
    print(f"storage total  {sum(nbytes.values()) / 2**20:.1f} MiB")
    print(f"memory plan    compute {plan.compute}: {plan.describe()}")
    stored, held = sum(nbytes.values()), plan.weight_bytes
    if abs(held - stored) > 0.01 * stored:
        if plan.compute == "f32":
            why = "compute f32 holds every weight as float32, the fastest on CPython (--compute q8 or q4: smaller)"
        elif held > stored:
            why = (
                "the compute forms keep each group's scale (and minimum) as float32 where the file has float16, "
                "and unpack formats the kernels cannot read as stored"
            )
        else:
            why = f"the weights are requantized into the smaller compute form {plan.compute}"
        print(f"in memory      weights {held / 2**20:.1f} MiB for {stored / 2**20:.1f} MiB stored: {why}")
    for note in dict.fromkeys(str(n.message) for n in notes):
        print(f"warning        {note}")
    return 0


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def main(argv: list[str] | None = None) -> int:
    return command_main(__name__, argv)
