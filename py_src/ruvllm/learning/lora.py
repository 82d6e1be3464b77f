"""MicroLoRA adapters: small low-rank updates on chosen projections, switched per request.

A LoRA adapter on a projection W (N, K) adds scale * B @ A, with A (r, K), B (N, r), scale = alpha / r:

    y = x @ W.T + scale * (x @ A.T) @ B.T

B starts at zero, so a new adapter changes nothing until it learns. The adapter wraps the weight
(`LoRAMatrix`), so the model code is the same with or without one. Several adapters can be held at
once (adapters.AdapterSet, which swaps the wrappers in and out of the weights without reloading them,
and merges an adapter on float32 weights into them exactly, and out again).

Gates: a keyed lesson (learn.py) writes its own inputs into a few rows of A, and LoRA being linear,
those rows also answer, a little, every input that points partly the same way: the small responses
that move unrelated answers. So each lesson's rows carry a gate (`Gate`): an input whose response to
those rows (its norm over them) is below the gate's `low` gets none of theirs, one from `high` up all
of it, and one between a share in proportion. The lesson's own inputs pass (`high` is their weakest
response); `LoRAMatrix.inner` applies it, and the backward goes through it (`gated_backward`).

Files: an adapter folder holds `adapter_config.json` and `adapter_model.safetensors` in the layout of
Hugging Face PEFT (so PEFT LoRA adapters load here and ours load in PEFT), plus, for adapters that
learn here, `learning_state.safetensors` (the EWC Fisher information and anchor, and Adam moments).
Gates are ruvllm's own: `ruvllm_gates` in adapter_config.json, which PEFT ignores (there the rows
answer every input, as LoRA's do), and a merge into weights can only drop them (`ruvllm merge --ungated`).

Dimension letters: T rows of x, N output features, K input features, r rank.
"""

from __future__ import annotations

import itertools
import json
import math
import os
from dataclasses import dataclass, field

import numpy as np

from ..errors import InvalidArgumentError, LoadError
from ..files import jsonfields as fields
from ..files.outputs import write_files
from ..files.tensorfile import SafetensorsFile, bf16_to_f32, serialize
from ..model.weights import Linear, Weights
from ..quant.matrices import MatrixLike
from .state import LearningState

_UIDS = itertools.count(1)
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head")
# Measured (benchmarks/RESULTS.md, "MicroLoRA" and "Learning that works"): down_proj learns new facts
# with the least damage, and at two thirds of the depth (20 and 21 of SmolLM2's 30) keyed lessons left
# the most unrelated answers alone: 97 of 120 chat answers over a fact, a Good and a Bad lesson (14-15:
# 90, 22-23: 95, 26-27: 92; 24-25 did not learn in 40 steps; the top two: 5 of 40 on the fact alone),
# with a step through 10 layers instead of 16 at half the depth.
DEFAULT_TARGETS = ("down_proj",)
DEFAULT_LAYERS = "two-thirds"  # the two layers from two thirds of the depth: 2 * count // 3 and the next
# Bounds that keep an adapter finite and its arrays allocatable: a rank is at most the matrix's smaller
# side (checked against the model), and a scale alpha/r far past any published recipe's (PEFT configs use
# 0.5-4) would only turn the update into infinities.
MAX_RANK = 65536
MAX_SCALE = 1e4
# The most an adapter file's update may add to one weight (scale x rank x its largest |A| x largest |B|,
# a bound on every entry of scale * B @ A), and the most one of its values may be: trained adapters stay
# far below 1 (weights are small numbers), while a tensor of 1e30 would merge into a model as infinities
# or as weights that say nothing.
MAX_UPDATE = 1e4
_FLOAT_DTYPES = ("F32", "F16", "BF16")
_GROUP = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn"}


@dataclass
class LoRAConfig:
    rank: int = 32
    alpha: float | None = None  # None: 2 x rank (a scale of 2)
    targets: tuple[str, ...] = DEFAULT_TARGETS
    # the decoder layers adapted (PEFT's layers_to_transform); negative counts from the top, as Python
    # indexes (-1: the last layer; those below the first layer are left out); None: every layer;
    # "two-thirds": the two from two thirds of the depth (DEFAULT_LAYERS)
    layers: tuple[int, ...] | str | None = DEFAULT_LAYERS

    def __post_init__(self) -> None:
        if not isinstance(self.rank, int) or isinstance(self.rank, bool) or not 1 <= self.rank <= MAX_RANK:
            raise InvalidArgumentError(f"rank must be an integer in [1, {MAX_RANK}], got {self.rank!r}")
        if self.alpha is not None:
            alpha = self.alpha
            if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not math.isfinite(alpha):
                raise InvalidArgumentError(f"alpha must be a finite number, got {alpha!r}")
            if not 0 < alpha / self.rank <= MAX_SCALE:
                raise InvalidArgumentError(
                    f"alpha / rank (the update's scale) must be in (0, {MAX_SCALE:g}], got {alpha!r} / {self.rank}"
                )
        unknown = [t for t in self.targets if t not in TARGETS]
        if unknown or not self.targets:
            raise InvalidArgumentError(f"targets must be among {', '.join(TARGETS)}, got {list(self.targets)}")
        self.targets = tuple(self.targets)
        if isinstance(self.layers, str):
            if self.layers != "two-thirds":
                raise InvalidArgumentError(f"layers must be a list of layer indexes or two-thirds, got {self.layers!r}")
        elif self.layers is not None:
            bad = [i for i in self.layers if not isinstance(i, int) or isinstance(i, bool)]
            if bad or not self.layers:
                raise InvalidArgumentError(f"layers must be a non-empty list of layer indexes, got {self.layers!r}")
            self.layers = tuple(self.layers)
        if self.alpha is None:
            self.alpha = 2.0 * self.rank

    def layer_indexes(self, count: int) -> list[int]:
        """The adapted layers of a model with `count` decoder layers, ascending; negative indexes
        count from the top."""
        if self.layers is None:
            return list(range(count))
        if isinstance(self.layers, str):  # "two-thirds" (__post_init__ allows no other)
            first = max(min(2 * count // 3, count - 2), 0)  # (two layers whenever the model has two)
            return sorted({first, min(first + 1, count - 1)})
        out = set()
        for i in self.layers:
            if i >= count:
                raise InvalidArgumentError(f"layer {i} is outside this model's {count} layers")
            if i >= -count:  # "the top k" of a model with fewer layers: all it has
                out.add(i % count)
        if not out:
            raise InvalidArgumentError(f"layers {list(self.layers)} are outside this model's {count} layers")
        return sorted(out)

    def resolved(self, count: int) -> LoRAConfig:
        """This config with its layers as non-negative indexes (None when every layer)."""
        indexes = self.layer_indexes(count)
        layers = None if len(indexes) == count else tuple(indexes)
        return LoRAConfig(self.rank, self.alpha, self.targets, layers)

    @property
    def scale(self) -> float:
        assert self.alpha is not None  # (__post_init__ sets the default)
        return self.alpha / self.rank


def module_names(weights: Weights, targets: tuple[str, ...], layers: list[int] | None = None) -> list[str]:
    """HF module names of the projections an adapter with these targets touches in `layers` (None:
    every layer), in model order."""
    names = []
    for i in range(len(weights.layers)) if layers is None else layers:
        for target in targets:
            if target == "lm_head":
                continue
            group = _GROUP.get(target, "mlp")
            names.append(f"model.layers.{i}.{group}.{target}")
    if "lm_head" in targets:
        names.append("lm_head")
    return names


def linear_of(weights: Weights, name: str) -> Linear:
    if name == "lm_head":
        return weights.lm_head
    _, _, index, group, target = name.split(".")
    return getattr(getattr(weights.layers[int(index)], group), target)


@dataclass(frozen=True)
class Gate:
    """Rows start..stop of A (one lesson's) answer an input by how strongly it answers them, s (the norm
    of x @ A[start:stop].T): not at all below `low`, fully from `high` up, in proportion between (a
    ramp, not a step: no input near the edge flips between two ways of computing the same thing)."""

    start: int
    stop: int
    low: float
    high: float

    def opening(self, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(how open (T,) in [0, 1], its derivative with respect to s) at responses s (T,)."""
        if self.high <= self.low:
            return (s >= self.low).astype(np.float32), np.zeros_like(s)
        width = np.float32(self.high - self.low)
        opened = np.clip((s - np.float32(self.low)) / width, 0, 1).astype(np.float32)
        return opened, ((s > self.low) & (s < self.high)).astype(np.float32) / width

    def apply(self, part: np.ndarray) -> None:
        """Scale, in place, the rows of part (T, stop - start: the gated rows' response) by the opening."""
        part *= self.opening(np.sqrt(np.einsum("tr,tr->t", part, part)))[0][:, None]


def gated_product(x: np.ndarray, A: np.ndarray, gates: list[Gate]) -> tuple[np.ndarray, np.ndarray | None]:
    """(x @ A.T (T, r), each gate's rows scaled by its opening; the product before the gates, or None
    with no gates: what gated_backward needs)."""
    low = x @ A.T
    if not gates:
        return low, None
    raw = low.copy()
    for gate in gates:
        gate.apply(low[:, gate.start : gate.stop])
    return low, raw


def gated_backward(d: np.ndarray, raw: np.ndarray, gates: list[Gate]) -> np.ndarray:
    """The gradient with respect to x @ A.T before the gates (raw, (T, r)), given d, the gradient with
    respect to the gated product: through each gate's opening too (it depends on the rows' response)."""
    out = d.copy()
    for gate in gates:
        z, dz = raw[:, gate.start : gate.stop], d[:, gate.start : gate.stop]
        s = np.sqrt(np.einsum("tr,tr->t", z, z))
        opened, slope = gate.opening(s)
        along = slope * np.einsum("tr,tr->t", dz, z) / np.maximum(s, np.float32(1e-30))
        out[:, gate.start : gate.stop] = opened[:, None] * dz + along[:, None] * z
    return out


class LoRAMatrix:
    """A base matrix plus scale * B @ A (its rows gated by `gates`); behaves like the base matrix
    everywhere."""

    def __init__(
        self, base: MatrixLike, A: np.ndarray, B: np.ndarray, scale: float, gates: list[Gate] | None = None
    ) -> None:
        self.base, self.A, self.B, self.scale = base, A, B, np.float32(scale)
        self.gates = [] if gates is None else gates  # (the adapter's own list: a lesson's new gate shows here)
        self.shape = base.shape
        self.kernel = getattr(base, "kernel", "blas")

    def __call__(self, x: np.ndarray) -> np.ndarray:
        y = self.base(x)  # (T, N)
        y += (self.inner(x) * self.scale) @ self.B.T  # (T, N)
        return y

    def inner(self, x: np.ndarray) -> np.ndarray:
        """x @ A.T (T, r), each gated lesson's rows scaled by its gate's opening."""
        return self.gated(x)[0]

    def gated(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """(inner(x), x @ A.T before the gates or None with none: gated_product)."""
        return gated_product(x, self.A, self.gates)

    def rows(self, ids: np.ndarray) -> np.ndarray:
        return self.base.rows(ids)  # an embedding lookup never goes through the adapter

    def dequantize(self) -> np.ndarray:
        if self.gates:
            raise InvalidArgumentError("a gated adapter's update is no matrix: it cannot be added into the weights")
        return self.base.dequantize() + self.scale * (self.B @ self.A)

    @property
    def nbytes(self) -> int:
        return self.base.nbytes + self.A.nbytes + self.B.nbytes


@dataclass
class Adapter:
    """The A and B matrices of one adapter, by HF module name, and what it learned from."""

    config: LoRAConfig
    A: dict[str, np.ndarray]  # (r, K) each
    B: dict[str, np.ndarray]  # (N, r) each
    state: LearningState = field(default_factory=LearningState)  # what learning keeps between lessons
    version: int = 0  # bumped on every update: the KV cache of an older version is stale
    uid: int = field(default_factory=lambda: next(_UIDS))  # tells apart adapters held under one name
    gates: dict[str, list[Gate]] = field(default_factory=dict)  # by module: its keyed lessons' gates
    # where the passes of remembered lessons start (learn.Lesson, rehearsal): made once, not saved
    starts: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def new(cls, weights: Weights, config: LoRAConfig, seed: int = 0) -> Adapter:
        """A fresh adapter: A small random (Kaiming-uniform, as PEFT), B zero."""
        rng = np.random.default_rng(seed)
        config = config.resolved(len(weights.layers))
        A, B = {}, {}
        names = module_names(weights, config.targets, config.layer_indexes(len(weights.layers)))
        smallest = min(min(linear_of(weights, name).matrix.shape) for name in names)
        if config.rank > smallest:  # before anything is allocated: a rank past it adds nothing
            raise InvalidArgumentError(
                f"rank {config.rank} is larger than the adapted matrices allow (at most {smallest}, their smaller side)"
            )
        for name in names:
            N, K = linear_of(weights, name).matrix.shape
            bound = np.sqrt(6.0 / ((1 + 5) * K))  # kaiming_uniform_(a=sqrt(5)) on a (r, K) matrix
            A[name] = rng.uniform(-bound, bound, (config.rank, K)).astype(np.float32)
            B[name] = np.zeros((N, config.rank), dtype=np.float32)
        return cls(config, A, B)

    @property
    def lowest_layer(self) -> int | None:
        """The lowest decoder layer this adapter changes (None: only lm_head); every layer below
        computes as in the base model."""
        layers = [int(name.split(".")[2]) for name in self.A if name != "lm_head"]
        return min(layers) if layers else None

    def grow(self, extra: int) -> None:
        """`extra` more rows of A and columns of B, zero: the same update with room for more lessons (the
        scale alpha / rank stays; what learning keeps per parameter grows alike). The arrays are new:
        weights wrapped with the old ones must be wrapped again (AdapterSet.refresh)."""
        scale = self.config.scale
        rank = self.config.rank + extra
        self.config = LoRAConfig(rank, scale * rank, self.config.targets, self.config.layers)
        for name, A in self.A.items():
            self.A[name] = np.concatenate([A, np.zeros((extra, A.shape[1]), A.dtype)])
            self.B[name] = np.concatenate([self.B[name], np.zeros((self.B[name].shape[0], extra), A.dtype)], axis=1)
        self.state.grow(extra)
        self.version += 1

    def parameters(self) -> list[tuple[str, np.ndarray]]:
        """(key, array) of every trainable array, in a fixed order."""
        out = []
        for name in self.A:
            out += [(f"{name}.lora_A", self.A[name]), (f"{name}.lora_B", self.B[name])]
        return out

    # --- files (PEFT layout) ------------------------------------------------------------------

    def files(self, base_model: str = "") -> dict[str, bytes]:
        """The adapter folder's files as bytes: adapter_config.json, adapter_model.safetensors and,
        once it has learned, learning_state.safetensors."""
        config = {
            "peft_type": "LORA",
            "r": self.config.rank,
            "lora_alpha": self.config.alpha,
            "target_modules": list(self.config.targets),
            "layers_to_transform": None if self.config.layers is None else list(self.config.layers),
            "bias": "none",
            "fan_in_fan_out": False,
            "use_rslora": False,
            "base_model_name_or_path": base_model,
            "ruvllm_version": self.version,
        }
        if any(self.gates.values()):
            config["ruvllm_gates"] = {
                name: [[g.start, g.stop, g.low, g.high] for g in gates] for name, gates in self.gates.items() if gates
            }
        tensors = {}
        for name in self.A:
            tensors[f"base_model.model.{name}.lora_A.weight"] = self.A[name]
            tensors[f"base_model.model.{name}.lora_B.weight"] = self.B[name]
        files = {
            "adapter_config.json": json.dumps(config, indent=2).encode(),
            "adapter_model.safetensors": serialize(tensors, {"format": "pt"}),
        }
        if self.state:
            files["learning_state.safetensors"] = serialize(self.state.tensors())
        return files

    def save(self, folder: str, base_model: str = "", force: bool = False, inputs=()) -> None:
        """Write the adapter folder whole (files/outputs.py: an existing folder only with `force`)."""
        write_files(folder, self.files(base_model), force, inputs)

    @classmethod
    def from_files(
        cls, config_json: str | bytes, weights_file: SafetensorsFile, weights: Weights, state_file=None
    ) -> Adapter:
        """An adapter from PEFT-layout files (already read), checked against the model's shapes."""
        source = "adapter_config.json"
        raw = fields.obj(fields.parse_json(config_json, source), source)
        if fields.string(raw, "peft_type", source, default="LORA") != "LORA":
            raise LoadError(f"{source}: peft_type {raw.get('peft_type')!r} is not LORA")
        bias = fields.string(raw, "bias", source, default="none")
        if fields.boolean(raw, "fan_in_fan_out", source) or bias != "none":
            raise LoadError(f"{source}: fan_in_fan_out and bias adapters are not supported")
        rank = fields.integer(raw, "r", source, default=8)
        if isinstance(raw.get("target_modules"), str):
            raise LoadError(f"{source}: target_modules as a regular expression is not supported")
        targets = fields.strings(raw, "target_modules", source)
        alpha = fields.number(raw, "lora_alpha", source, default=float(rank))
        layers = raw.get("layers_to_transform")
        layers = [layers] if isinstance(layers, int) and not isinstance(layers, bool) else layers
        count = len(weights.layers)
        if layers is not None and (
            not isinstance(layers, list)
            or not layers
            or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < count for i in layers)
        ):  # (PEFT's indexes: no negative ones, which ruvllm's own options take as counted from the top)
            raise LoadError(
                f"{source}: layers_to_transform must be a layer index in [0, {count}) or a non-empty list of "
                f"them (this model has {count} layers), got {json.dumps(layers)[:80]}"
            )
        try:
            config = LoRAConfig(rank, alpha, tuple(targets), None if layers is None else tuple(layers))
            config = config.resolved(len(weights.layers))
        except InvalidArgumentError as e:
            raise LoadError(f"{source}: {e.message}") from None
        if fields.boolean(raw, "use_rslora", source):
            config.alpha = alpha * rank / np.sqrt(rank)  # alpha/sqrt(r) as alpha/r
        A: dict[str, np.ndarray] = {}  # (rank, K) by module name
        B: dict[str, np.ndarray] = {}  # (N, rank)
        for name in module_names(weights, config.targets, config.layer_indexes(len(weights.layers))):
            N, K = linear_of(weights, name).matrix.shape
            for part, store, shape in (("lora_A", A, (rank, K)), ("lora_B", B, (N, rank))):
                key = f"base_model.model.{name}.{part}.weight"
                if key not in weights_file:
                    raise LoadError(f"adapter_model.safetensors has no {key}")
                store[name] = float_tensor(weights_file, key, shape, "this model")
            largest = float(np.abs(A[name]).max(initial=0)), float(np.abs(B[name]).max(initial=0))
            if max(largest) > MAX_UPDATE:
                part = "lora_A" if largest[0] > MAX_UPDATE else "lora_B"
                raise LoadError(
                    f"adapter_model.safetensors: {name}'s {part} holds {max(largest):.3g} (at most {MAX_UPDATE:g}): "
                    "not an adapter's values"
                )
            reach = config.scale * rank * largest[0] * largest[1]
            if reach > MAX_UPDATE:
                raise LoadError(
                    f"adapter_model.safetensors: the update of {name} could reach {reach:.3g} in one weight "
                    f"(scale x rank x its largest |lora_A| x largest |lora_B|; at most {MAX_UPDATE:g}): not an "
                    "adapter's values"
                )
        state = LearningState.from_tensors({k: state_file.get(k) for k in state_file.keys()}) if state_file else None
        state = state or LearningState()
        version = fields.integer(raw, "ruvllm_version", source, default=0, minimum=0)
        return cls(config, A, B, state, version, gates=read_gates(raw.get("ruvllm_gates"), A, source))

    def ungated(self, what: str, remedy: str = "") -> None:
        """Refuse (naming `what`) an adapter whose rows are gated: no matrix computes what it does."""
        gated = [name for name, gates in self.gates.items() if gates]
        if gated:
            raise InvalidArgumentError(
                f"this adapter's lessons are gated (each answers only inputs near its own; {gated[0]} and "
                f"{len(gated) - 1} more): {what} cannot hold a gate, so every input would get the lessons' "
                f"rows and more unrelated answers would move{remedy}"
            )

    @classmethod
    def load(cls, folder: str, weights: Weights) -> Adapter:
        config_json, model_path = read_folder(folder, "an adapter folder")
        state_path = os.path.join(folder, "learning_state.safetensors")
        state = SafetensorsFile.from_path(state_path) if os.path.exists(state_path) else None
        return cls.from_files(config_json, SafetensorsFile.from_path(model_path), weights, state)


def read_gates(raw: object, A: dict[str, np.ndarray], source: str) -> dict[str, list[Gate]]:
    """adapter_config.json's `ruvllm_gates` ({module: [[start, stop, low, high], ...]}), checked against
    the adapter's modules and rank."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise LoadError(f"{source}: ruvllm_gates must be an object of modules, got {json.dumps(raw)[:80]}")
    gates: dict[str, list[Gate]] = {}
    for name, entries in raw.items():
        if name not in A:
            raise LoadError(f"{source}: ruvllm_gates names {name!r}, which the adapter does not adapt")
        rank = A[name].shape[0]
        gates[name] = []
        for entry in entries if isinstance(entries, list) else [entries]:
            valid = isinstance(entry, list) and len(entry) == 4
            start, stop, low, high = entry if valid else (0, 0, 0, 0)
            valid = valid and all(isinstance(v, int) and not isinstance(v, bool) for v in (start, stop))
            valid = valid and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (low, high))
            valid = valid and 0 <= start < stop <= rank and math.isfinite(high) and 0 <= low <= high
            if not valid:
                raise LoadError(
                    f"{source}: a gate of {name} must be [start, stop, low, high] with 0 <= start < stop <= {rank} "
                    f"and finite 0 <= low <= high, got {json.dumps(entry)[:80]}"
                )
            gates[name].append(Gate(start, stop, float(low), float(high)))
    return gates


def float_tensor(file: SafetensorsFile, key: str, shape: tuple[int, ...] | None = None, whose: str = "") -> np.ndarray:
    """Tensor `key` of an adapter's safetensors as float32, checked: a float dtype, `shape` (when
    given), finite values."""
    dtype = file.info(key).dtype
    if dtype not in _FLOAT_DTYPES:
        raise LoadError(f"{key} is {dtype}; adapter tensors must be {', '.join(_FLOAT_DTYPES)}")
    array = file.get(key)
    if shape is not None and array.shape != tuple(shape):
        raise LoadError(f"{key} has shape {list(array.shape)}, expected {list(shape)} for {whose}")
    array = (bf16_to_f32(array) if dtype == "BF16" else array).astype(np.float32)
    if not np.isfinite(array).all():
        raise LoadError(f"{key} holds non-finite values (NaN or infinity)")
    return array


def read_folder(folder: str, what: str) -> tuple[bytes, str]:
    """(the bytes of adapter_config.json, the path of adapter_model.safetensors) of a PEFT folder."""
    config_path = os.path.join(folder, "adapter_config.json")
    model_path = os.path.join(folder, "adapter_model.safetensors")
    if not os.path.exists(config_path) or not os.path.exists(model_path):
        raise LoadError(f"{folder}: {what} needs adapter_config.json and adapter_model.safetensors")
    try:
        with open(config_path, "rb") as f:
            return f.read(), model_path
    except OSError as e:
        raise LoadError(f"cannot read {config_path}: {e.strerror or e}") from None
