"""X-LoRA: several LoRA adapters (experts) active at once, mixed per token by a small learned router.

As in the X-LoRA paper (Buehler & Buehler, 2024) and PEFT's `XLoraModel`, a forward runs twice:

1. the scaling pass: every expert contributes with one constant scaling (`scaling_pass_value`, 0 by
   default: the base model); the router reads the last hidden state (after the final norm) of each
   token and gives scalings (T, L, E): for each of the L adapted projections (in model order) a
   weight per expert, softmax-normalized;
2. the real pass: each adapted projection adds, per token t, the experts' updates weighted by them:

       y_t = W x_t + g * sum_e s[t, l, e] * scale_e * B_e A_e x_t

   where g is `global_scaling_weight`; with `top_k` only the k largest scalings of a token stay (and
   with `softmax_topk` those k are softmax-normalized again).

The router is an MLP: depth 1 is one Linear (hidden -> E, or L*E with `layerwise`), depth d adds d-1
Linear+ReLU layers of width `size` before it. Generation caches both passes (the scaling pass keeps
its own KVCache beside the generation's), so a token costs two forwards, not a re-run of the prefix.

Files: PEFT's layout. adapter_config.json (peft_type XLORA, `adapters`: name -> path) and
adapter_model.safetensors holding `...internal_xlora_classifier.layers.<i>.weight/.bias` (i the index in
PEFT's nn.Sequential: Linear, ReLU[, Dropout], ...); each expert a LoRA folder, found as the subfolder
named after it (the Hugging Face Hub layout) or at its path in `adapters` (absolute or relative).

The router learns from feedback like an adapter (`route_gradients`): the experts stay as they are, and
the gradient of the completion's log-likelihood reaches the router through the scalings.

Dimension letters: T tokens, D hidden, L adapted projections, E experts, r rank, H router width.
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
from ..files.outputs import plain_name, write_files
from ..files.tensorfile import SafetensorsFile, serialize
from ..model.weights import Weights
from ..quant.matrices import MatrixLike
from .lora import TARGETS, Adapter, float_tensor, gated_backward, gated_product, linear_of, read_folder

_UIDS = itertools.count(1_000_000)  # apart from adapters' uids: identities of both kinds never collide
_ROUTER = "internal_xlora_classifier.layers."  # PEFT's key of the router's nn.Sequential
_ORDER = {target: i for i, target in enumerate(TARGETS)}  # a decoder layer's projections in model order


# Bounds on a router (PEFT's default width is 2048, depth 1-3), and on its size in memory: a mistyped
# width must be an error, not a MemoryError after gigabytes are taken.
MAX_DEPTH = 64
MAX_SIZE = 65536
MAX_ROUTER_PARAMETERS = 1 << 28  # 1 GiB of float32


@dataclass
class RouterConfig:
    """The router's shape and how its scalings are used (the fields of PEFT's XLoraConfig)."""

    depth: int = 1
    size: int = 2048  # hidden width, when depth > 1
    layerwise: bool = False  # scalings per adapted projection (else one set for all)
    softmax: bool = True
    softmax_topk: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    scaling_pass_value: float = 0.0
    global_scaling_weight: float = 1.0
    dropout: float = 0.0  # the router's dropout in training (PEFT's); unused here but it places the keys

    def sequential_indexes(self) -> list[int]:
        """Where the Linear layers sit in PEFT's nn.Sequential: (Linear, ReLU[, Dropout]) per hidden
        layer, Dropout only when its probability is above 0, then the last Linear."""
        step = 3 if self.dropout > 0 else 2
        return [step * i for i in range(self.depth)]

    def __post_init__(self) -> None:
        for name, most in (("depth", MAX_DEPTH), ("size", MAX_SIZE)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= most:
                raise InvalidArgumentError(f"router {name} must be an integer in [1, {most}], got {value!r}")
        if self.top_k is not None and (
            not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 1
        ):
            raise InvalidArgumentError(f"top_k must be a positive integer or None, got {self.top_k!r}")
        if not isinstance(self.temperature, (int, float)) or not 0 < self.temperature < math.inf:
            raise InvalidArgumentError(f"temperature must be a positive finite number, got {self.temperature!r}")
        for name in ("scaling_pass_value", "global_scaling_weight", "dropout"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                raise InvalidArgumentError(f"{name} must be a finite number, got {value!r}")

    def parameter_count(self, hidden_size: int, outputs: int) -> int:
        """The router's weights and biases for `hidden_size` inputs and `outputs` scalings."""
        widths = [hidden_size] + [self.size] * (self.depth - 1) + [outputs]
        return sum((a + 1) * b for a, b in itertools.pairwise(widths))


def mixed_modules(experts: list[Adapter]) -> list[str]:
    """Every projection some expert adapts, in the model's order (PEFT numbers them so)."""
    names = {name for expert in experts for name in expert.A}
    if "lm_head" in names:
        raise InvalidArgumentError("X-LoRA experts on lm_head are not supported (the router reads its input)")
    return sorted(names, key=lambda n: (int(n.split(".")[2]), _ORDER[n.split(".")[-1]]))


class Mixture:
    """Experts, the router's layers [(W (out, in), b (out,))] and the scalings the mixed projections
    use now (set by `route` or `constant` before each pass)."""

    def __init__(self, experts: dict[str, Adapter], layers: list, config: RouterConfig, hidden_size: int) -> None:
        if not experts:
            raise InvalidArgumentError("a mixture needs at least one expert adapter")
        self.names = [plain_name(name, "an expert's name") for name in experts]  # each names a subfolder
        self.experts = list(experts.values())
        self.config = config
        self.modules = mixed_modules(self.experts)
        E, L = len(self.experts), len(self.modules)
        if config.top_k is not None and config.top_k > E:
            raise InvalidArgumentError(f"top_k is {config.top_k} but the mixture has {E} experts")
        widths = [hidden_size] + [config.size] * (config.depth - 1) + [E * L if config.layerwise else E]
        if len(layers) != config.depth:
            raise LoadError(f"the router has {len(layers)} layers, its config says depth {config.depth}")
        for i, (W, b) in enumerate(layers):
            if W.shape != (widths[i + 1], widths[i]) or b.shape != (widths[i + 1],):
                raise LoadError(
                    f"router layer {i} has weight {list(W.shape)} and bias {list(b.shape)}, expected "
                    f"{[widths[i + 1], widths[i]]} and {[widths[i + 1]]} for this model and these experts"
                )
        self.layers = [(W.astype(np.float32), b.astype(np.float32)) for W, b in layers]
        self.version = 0
        self.uid = next(_UIDS)
        self.mixes: list[np.ndarray] = []  # per adapted projection: (T, E) the weights of this pass
        self._trace: tuple | None = None  # what `route` computed, for `route_backward`

    @classmethod
    def new(cls, experts: dict[str, Adapter], hidden_size: int, config: RouterConfig | None = None, seed: int = 0):
        """A fresh router: its last layer zero, so every token starts with equal scalings (1/E each)."""
        config = config or RouterConfig()
        rng = np.random.default_rng(seed)
        L = len(mixed_modules(list(experts.values())))
        count = config.parameter_count(hidden_size, len(experts) * L if config.layerwise else len(experts))
        if count > MAX_ROUTER_PARAMETERS:
            raise InvalidArgumentError(
                f"a router of depth {config.depth} and size {config.size} would hold {count:,} parameters "
                f"({count * 4 / 2**30:.1f} GiB); at most {MAX_ROUTER_PARAMETERS:,}: choose a smaller size or depth"
            )
        widths = [hidden_size] + [config.size] * (config.depth - 1)
        widths.append(len(experts) * L if config.layerwise else len(experts))
        layers = []
        for i in range(config.depth):
            bound = 1.0 / np.sqrt(widths[i])  # torch's nn.Linear initialization
            W = rng.uniform(-bound, bound, (widths[i + 1], widths[i])).astype(np.float32)
            layers.append((W, np.zeros(widths[i + 1], np.float32)))
        layers[-1] = (np.zeros_like(layers[-1][0]), layers[-1][1])
        return cls(experts, layers, config, hidden_size)

    @property
    def lowest_layer(self) -> int:
        return int(self.modules[0].split(".")[2])

    # --- the two passes ----------------------------------------------------------------------

    def constant(self, T: int) -> None:
        """Scalings for the scaling pass: every one `scaling_pass_value`."""
        value = np.float32(self.config.scaling_pass_value)
        self._set(np.full((T, len(self.modules), len(self.experts)), value, np.float32))

    def route(self, final: np.ndarray) -> np.ndarray:
        """Scalings (T, L, E) from the scaling pass's final hidden states (T, D), set for the real pass."""
        inputs, x = [], final.astype(np.float32)
        for i, (W, b) in enumerate(self.layers):
            inputs.append(x)
            x = x @ W.T + b
            if i < len(self.layers) - 1:
                x = np.maximum(x, 0)
        T, L, E = len(final), len(self.modules), len(self.experts)
        logits = x.reshape(T, L, E) if self.config.layerwise else np.broadcast_to(x[:, None, :], (T, L, E))
        scalings = _softmax(logits / np.float32(self.config.temperature)) if self.config.softmax else logits
        self._trace = (inputs, scalings)
        self._set(scalings)
        return scalings

    def _set(self, scalings: np.ndarray) -> None:
        self.mixes = [self._kept(scalings[:, i, :]) for i in range(scalings.shape[1])]

    def _kept(self, s: np.ndarray) -> np.ndarray:
        """A projection's (T, E) scalings after top-k (and the softmax over the k kept)."""
        if self.config.top_k is not None:
            s = np.where(self._mask(s), s, 0).astype(np.float32)
        if self.config.softmax_topk:  # a softmax over the nonzero scalings (a row without any stays zero)
            nonzero = s != 0
            z = np.where(nonzero, s, -np.inf)
            with np.errstate(invalid="ignore"):
                e = np.where(nonzero, np.exp(z - z.max(axis=1, keepdims=True)), 0)
            s = (e / np.maximum(e.sum(axis=1, keepdims=True), 1e-30)).astype(np.float32)
        return s

    # --- learning ----------------------------------------------------------------------------

    def route_backward(self, d_mixes: dict[int, np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Gradients [(dW, db)] of the router's layers, given the loss's gradient with respect to each
        projection's mix {l: (T, E)} of the last `route`."""
        assert self._trace is not None, "route_backward before route"
        inputs, scalings = self._trace
        T, L, E = scalings.shape
        config = self.config
        ds = np.zeros((T, L, E), np.float32)
        for i, d in d_mixes.items():
            ds[:, i, :] = self._kept_backward(scalings[:, i, :], d)
        if config.softmax:  # through s = softmax(logits / temperature)
            ds = scalings * (ds - np.sum(ds * scalings, axis=-1, keepdims=True)) / np.float32(config.temperature)
        dx = ds.reshape(T, L * E) if config.layerwise else ds.sum(axis=1)  # (T, out)
        grads = []
        for i in reversed(range(len(self.layers))):
            W, _ = self.layers[i]
            grads.append((dx.T @ inputs[i], dx.sum(axis=0)))
            if i:
                dx = (dx @ W) * (inputs[i] > 0)  # ReLU: inputs[i] is the ReLU's output
        return grads[::-1]

    def _kept_backward(self, s: np.ndarray, d: np.ndarray) -> np.ndarray:
        """The gradient with respect to s (T, E), given that of `_kept(s)`."""
        if self.config.softmax_topk:  # through the softmax over the kept (nonzero) ones
            kept = self._kept(s)
            d = np.where(kept != 0, kept * (d - np.sum(d * kept, axis=1, keepdims=True)), 0)
        elif self.config.top_k is not None:
            d = np.where(self._mask(s), d, 0)
        return d.astype(np.float32)

    def _mask(self, s: np.ndarray) -> np.ndarray:
        """Where each row's `top_k` largest scalings are (ties: the first experts)."""
        order = np.argsort(-s, axis=1, kind="stable")[:, : self.config.top_k]
        mask = np.zeros(s.shape, bool)
        np.put_along_axis(mask, order, True, axis=1)
        return mask

    def parameters(self) -> list[tuple[str, np.ndarray]]:
        out = []
        for i, (W, b) in enumerate(self.layers):
            out += [(f"router.{i}.weight", W), (f"router.{i}.bias", b)]
        return out

    # --- files (PEFT layout) -----------------------------------------------------------------

    def files(self) -> dict[str, bytes]:
        """The mixture's folder as {relative path: bytes}: the X-LoRA config and router, and each
        expert's folder under its name."""
        c = self.config
        config = {
            "peft_type": "XLORA",
            "task_type": "CAUSAL_LM",
            "hidden_size": self.layers[0][0].shape[1],
            "adapters": {name: name for name in self.names},
            "xlora_depth": c.depth,
            "xlora_size": c.size,
            "layerwise_scalings": c.layerwise,
            "enable_softmax": c.softmax,
            "enable_softmax_topk": c.softmax_topk,
            "softmax_temperature": c.temperature,
            "top_k_lora": c.top_k,
            "scaling_pass_value": c.scaling_pass_value,
            "global_scaling_weight": c.global_scaling_weight,
            "xlora_dropout_p": c.dropout,
            "use_trainable_adapters": False,
            "ruvllm_version": self.version,
        }
        tensors = {}
        for i, (W, b) in zip(c.sequential_indexes(), self.layers, strict=True):
            tensors[f"base_model.{_ROUTER}{i}.weight"], tensors[f"base_model.{_ROUTER}{i}.bias"] = W, b
        files = {
            "adapter_config.json": json.dumps(config, indent=2).encode(),
            "adapter_model.safetensors": serialize(tensors, {"format": "pt"}),
        }
        for name, expert in zip(self.names, self.experts, strict=True):
            files.update({f"{name}/{file}": data for file, data in expert.files().items()})
        return files

    def save(self, folder: str, force: bool = False, inputs=()) -> None:
        """Write the mixture's folder whole, experts in subfolders (files/outputs.py: an existing folder
        only with `force`)."""
        write_files(folder, self.files(), force, inputs)

    @classmethod
    def from_files(
        cls, config_json: str | bytes, router_file: SafetensorsFile, experts: dict[str, Adapter], hidden_size: int
    ) -> Mixture:
        """A mixture from an X-LoRA adapter_config.json, its router weights and its experts (loaded)."""
        source = "adapter_config.json"
        raw = _config(config_json)
        try:
            config = RouterConfig(
                depth=fields.integer(raw, "xlora_depth", source, default=1),
                size=fields.integer(raw, "xlora_size", source, default=2048),
                layerwise=fields.boolean(raw, "layerwise_scalings", source),
                softmax=fields.boolean(raw, "enable_softmax", source, default=True),
                softmax_topk=fields.boolean(raw, "enable_softmax_topk", source),
                temperature=fields.number(raw, "softmax_temperature", source, default=1.0),
                top_k=raw.get("top_k_lora"),
                scaling_pass_value=fields.real(raw, "scaling_pass_value", source, default=0.0),
                global_scaling_weight=fields.real(raw, "global_scaling_weight", source, default=1.0),
                dropout=fields.real(raw, "xlora_dropout_p", source, default=0.2),
            )
        except InvalidArgumentError as e:
            raise LoadError(f"{source}: {e.message}") from None
        stated = fields.integer(raw, "hidden_size", source, default=hidden_size)
        if stated != hidden_size:
            raise LoadError(f"{source}: hidden_size is {stated}, this model's is {hidden_size}")
        found = [k for k in router_file.keys() if _ROUTER in k]  # the prefix before it varies with the saver
        prefix = found[0][: found[0].index(_ROUTER)] if found else "base_model."
        layers = []
        for i in config.sequential_indexes():
            pair = []
            for part in ("weight", "bias"):
                key = f"{prefix}{_ROUTER}{i}.{part}"
                if key not in router_file:
                    raise LoadError(f"adapter_model.safetensors has no {key} (the X-LoRA router)")
                pair.append(float_tensor(router_file, key))
            layers.append(tuple(pair))
        mixture = cls(experts, layers, config, hidden_size)
        mixture.version = fields.integer(raw, "ruvllm_version", source, default=0, minimum=0)
        return mixture

    @classmethod
    def load(cls, folder: str, weights: Weights) -> Mixture:
        """A PEFT X-LoRA folder: its config, router and experts (subfolders, or the config's paths)."""
        config_json, router_path = read_folder(folder, "an X-LoRA folder")
        config_path = os.path.join(folder, "adapter_config.json")
        raw = _config(config_json)
        adapters = raw.get("adapters")
        if not isinstance(adapters, dict) or not adapters:
            raise LoadError(f"{config_path}: adapters must name the expert adapters (name: path)")
        experts = {}
        for name, path in adapters.items():
            try:
                plain_name(name, "expert")  # it names the expert's subfolder, here and when saved
            except InvalidArgumentError as e:
                raise LoadError(f"{config_path}: {e.message}") from None
            candidates = [os.path.join(folder, name)]
            if isinstance(path, str):
                candidates.append(path if os.path.isabs(path) else os.path.join(folder, path))
            found = next((c for c in candidates if os.path.exists(os.path.join(c, "adapter_config.json"))), None)
            if found is None:
                raise LoadError(
                    f"{config_path}: expert {name!r} not found (looked in {', '.join(dict.fromkeys(candidates))})"
                )
            experts[name] = Adapter.load(found, weights)
        hidden_size = weights.embed_tokens.shape[1]
        return cls.from_files(config_json, SafetensorsFile.from_path(router_path), experts, hidden_size)


def is_xlora(config_path: str) -> bool:
    """Whether the adapter_config.json at `config_path` describes an X-LoRA mixture."""
    try:
        raw = fields.read_json(config_path)
    except LoadError:
        return False  # not there or not JSON: the LoRA loader says what is wrong
    return isinstance(raw, dict) and raw.get("peft_type") == "XLORA"


def _config(config_json: str | bytes) -> dict:
    raw = fields.obj(fields.parse_json(config_json, "adapter_config.json"), "adapter_config.json")
    if raw.get("peft_type") != "XLORA":
        raise LoadError(f"adapter_config.json: peft_type {raw.get('peft_type')!r} is not XLORA")
    return raw


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)


@dataclass
class MixedMatrix:
    """A base matrix plus the experts' updates on it, weighted per token by the mixture's scalings for
    projection `index`: behaves like the base matrix everywhere."""

    base: MatrixLike
    mixture: Mixture
    index: int
    experts: list = field(default_factory=list)  # (expert number, A (r, K), B (N, r), scale, its gates)

    def __post_init__(self) -> None:
        self.shape = self.base.shape
        self.kernel = getattr(self.base, "kernel", "blas")

    def __call__(self, x: np.ndarray) -> np.ndarray:
        y = self.base(x)  # (T, N)
        s = self.mixture.mixes[self.index]  # (T, E)
        g = np.float32(self.mixture.config.global_scaling_weight)
        for e, A, B, scale, gates in self.experts:
            y += (gated_product(x, A, gates)[0] * (s[:, e : e + 1] * (g * scale))) @ B.T  # (T, N)
        return y

    def rows(self, ids: np.ndarray) -> np.ndarray:
        return self.base.rows(ids)

    def dequantize(self) -> np.ndarray:
        raise InvalidArgumentError("a projection mixed per token has no single matrix")

    @property
    def nbytes(self) -> int:
        return self.base.nbytes

    def backward(self, dy: np.ndarray, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(the gradient (T, E) with respect to this projection's mix, dx (T, K) through the experts
        only: the caller adds the base matrix's part)."""
        s = self.mixture.mixes[self.index]
        g = np.float32(self.mixture.config.global_scaling_weight)
        d_mix = np.zeros_like(s)
        dx = np.zeros_like(x)
        for e, A, B, scale, gates in self.experts:
            low, raw = gated_product(x, A, gates)  # (T, r)
            back = dy @ B  # (T, r)
            d_mix[:, e] += g * scale * np.sum(back * low, axis=1)
            d_low = back * (s[:, e : e + 1] * (g * scale))
            dx += (d_low if raw is None else gated_backward(d_low, raw, gates)) @ A
        return d_mix, dx


def mixed(weights: Weights, mixture: Mixture) -> dict[str, MixedMatrix]:
    """The wrappers of every projection the mixture adapts, by module name."""
    out = {}
    for index, module in enumerate(mixture.modules):
        experts = [
            (e, expert.A[module], expert.B[module], np.float32(expert.config.scale), expert.gates.get(module, []))
            for e, expert in enumerate(mixture.experts)
            if module in expert.A
        ]
        out[module] = MixedMatrix(linear_of(weights, module).matrix, mixture, index, experts)
    return out
