"""The adapters one loaded model holds (LoRA adapters and X-LoRA mixtures of them): which one the
weights are wrapped with, merging one into the base weights, and the identity of what they compute.
Above lora.py and xlora.py, which do not import it.
"""

from __future__ import annotations

import threading
import weakref

import numpy as np

from ..errors import InferenceError, InvalidArgumentError
from ..model.cache import KVCache
from ..model.forward import hidden, rms_norm
from ..model.kv import Cache
from ..model.weights import Weights
from ..quant.matrices import DenseMatrix, Int8Matrix, MatrixLike
from ..runtime.engine import Engine, WeightsIdentity
from .lora import Adapter, LoRAConfig, LoRAMatrix, linear_of
from .xlora import Mixture, mixed


class AdapterSet:
    """Adapters held by one loaded model.

    `active` is the selected adapter (None: the base model): what a computation uses unless it names
    another. `apply` wraps the weights with one adapter; a generation re-applies the adapter it started
    with before each step, so interleaved generations with different adapters each compute with their
    own. Everything that changes the weights (wrapping, merging) holds `lock`, the lock a forward holds.
    """

    def __init__(self, weights: Weights, lock: threading.RLock | None = None) -> None:
        self.weights = weights
        self.lock = lock or threading.RLock()
        self.adapters: dict[str, Adapter] = {}
        self.mixtures: dict = {}  # X-LoRA mixtures of adapters (learning.xlora.Mixture), by name
        self.active: str | None = None
        self.merges = 0  # how many times an adapter was merged into (or out of) the base weights
        self._applied: str | None = None  # the adapter the weights are wrapped with now
        self._lowest: dict[int, int] = {}  # by adapter uid: the lowest layer it changes (shared_layers)
        self._originals: dict[str, MatrixLike] = {}
        # new caches keep the hidden states entering this layer: what a lesson on the default adapter starts from
        self.tap_layer: int | None = LoRAConfig().layer_indexes(len(weights.layers))[0] or None
        # by cache: the entries of X-LoRA's scaling pass over its tokens (valid while the cache's are: a
        # mixture changes every layer, so whatever changes it rewinds the cache to 0 and the pass with it)
        self.scaling_caches: weakref.WeakKeyDictionary[KVCache, KVCache] = weakref.WeakKeyDictionary()

    @classmethod
    def attached(cls, engine: Engine) -> AdapterSet:
        """The adapters of `engine`, attached to it on first use, sharing its lock."""
        if engine.wrappers is None:
            engine.attach(cls(engine.weights, engine.lock))
        assert isinstance(engine.wrappers, AdapterSet)  # (the only wrappers there are)
        return engine.wrappers

    def add(self, name: str, adapter) -> None:
        """Hold `adapter` (an Adapter, or an X-LoRA Mixture) under `name`, replacing what was held there."""
        with self.lock:
            if self.active == name:
                self.activate(None)
            if self._applied == name:
                self.apply(None)
            self.adapters.pop(name, None)
            self.mixtures.pop(name, None)
            if isinstance(adapter, Adapter):
                self.adapters[name] = adapter
                lowest = adapter.lowest_layer
                self._lowest[adapter.uid] = len(self.weights.layers) if lowest is None else lowest
            else:  # a mixture's scalings depend on every position: a cache computed otherwise starts over
                self.mixtures[name] = adapter
                self._lowest[adapter.uid] = 0

    def create(self, name: str, config: LoRAConfig | None = None) -> Adapter:
        """A fresh adapter (it changes nothing until it learns), held under `name` and made active."""
        adapter = Adapter.new(self.weights, config or LoRAConfig())
        with self.lock:
            self.add(name, adapter)
            self.activate(name)
        return adapter

    def learner(self, name: str):
        """Adapter (or X-LoRA mixture) `name`, an adapter made with the default config if none is held,
        and active: the one to adapt."""
        with self.lock:
            if name in self.mixtures:
                self.activate(name)
                return self.mixtures[name]
            if name not in self.adapters:
                return self.create(name)
            self.activate(name)
            return self.adapters[name]

    def get(self, name: str | None = None) -> Adapter:
        """A held adapter (default: the active one)."""
        name = name or self.active
        if name in self.mixtures:
            raise InvalidArgumentError(f"{name!r} is an X-LoRA mixture, not a LoRA adapter")
        if name not in self.adapters:
            known = ", ".join(self.adapters) or "none loaded"
            raise InvalidArgumentError(f"no adapter named {name!r} (adapters: {known})")
        return self.adapters[name]

    def mix(self, name: str, experts, config=None):
        """An X-LoRA mixture (xlora.Mixture) of held adapters, copied as they are now (one that learns
        later does not change it), with a new router that weighs them evenly (xlora.RouterConfig
        `config`); held under `name` and made active."""

        if not isinstance(experts, (list, tuple)) or not experts or len(set(experts)) != len(experts):
            raise InvalidArgumentError(f"experts must be a list of distinct adapter names, got {experts!r}")
        copies = {}
        for e in experts:
            held = self.get(e)
            A, B = {k: a.copy() for k, a in held.A.items()}, {k: b.copy() for k, b in held.B.items()}
            copies[e] = Adapter(held.config, A, B, gates={k: list(g) for k, g in held.gates.items()})
        mixture = Mixture.new(copies, self.weights.embed_tokens.shape[1], config)
        with self.lock:
            self.add(name, mixture)
            self.activate(name)
        return mixture

    def held(self, name: str | None = None):
        """A held adapter or X-LoRA mixture (default: the active one)."""
        name = name or self.active
        return self.mixtures[name] if name in self.mixtures else self.get(name)

    def describe(self) -> list[dict]:
        """Every adapter and mixture held: name, kind, version, whether active, and its shape."""
        out = []
        for name, adapter in self.adapters.items():
            c = adapter.config
            layers = None if c.layers is None else list(c.layers)
            shape = {"rank": c.rank, "alpha": c.alpha, "targets": list(c.targets), "layers": layers}
            out.append({"name": name, "kind": "lora", "version": adapter.version, **shape})
        for name, mixture in self.mixtures.items():
            c = mixture.config
            shape = {"experts": list(mixture.names), "top_k": c.top_k, "depth": c.depth, "layerwise": c.layerwise}
            out.append({"name": name, "kind": "xlora", "version": mixture.version, **shape})
        return [{**entry, "active": entry["name"] == self.active} for entry in out]

    def activate(self, name: str | None) -> None:
        """Select adapter or mixture `name` (None: the base model) and wrap the weights with it."""
        if name is not None and name not in self.mixtures:
            self.get(name)  # known, or an error listing the held ones
        with self.lock:
            self.active = name
            self.apply(name)

    def apply(self, name: str | None) -> None:
        """Wrap the weights with adapter `name` (None: none), leaving the selection as it is."""
        with self.lock:
            if name == self._applied:
                return
            for module, original in self._originals.items():
                linear_of(self.weights, module).matrix = original
            self._originals.clear()
            self._applied = name
            if name is None:
                return
            if name in self.mixtures:
                for module, matrix in mixed(self.weights, self.mixtures[name]).items():
                    lin = linear_of(self.weights, module)
                    self._originals[module] = lin.matrix
                    lin.matrix = matrix
                return
            adapter = self.get(name)
            for module in adapter.A:
                lin = linear_of(self.weights, module)
                self._originals[module] = lin.matrix
                lin.matrix = LoRAMatrix(
                    lin.matrix,
                    adapter.A[module],
                    adapter.B[module],
                    adapter.config.scale,
                    adapter.gates.setdefault(module, []),
                )

    def refresh(self, adapter: Adapter) -> None:
        """Wrap the weights again if they are wrapped with `adapter`, whose arrays were replaced (it grew)."""
        with self.lock:
            name = self._applied
            if name is not None and self.adapters.get(name) is adapter:
                self.apply(None)
                self.apply(name)

    def identity(self) -> WeightsIdentity:
        """What the weights compute with the active adapter (merges, its name, uid and version).
        Cached keys and values are tagged with it; a generation pins it (`use`)."""
        return self._identity_of(self.active)

    def use(self, identity: WeightsIdentity) -> None:
        """Wrap the weights with the adapter `identity` names, refusing if it changed since (it learned,
        was replaced, or an adapter was merged into the base weights): keys cached with it are stale."""
        with self.lock:
            name = identity.adapter
            if self._identity_of(name) != identity:
                what = "the base weights" if name is None else f"adapter {name!r}"
                raise InferenceError(
                    f"{what} changed while this generation was running (an adapter learned, was replaced or "
                    "merged); start a new generation"
                )
            self.apply(name)

    def mixing(self) -> bool:
        """Whether the active adapter is an X-LoRA mixture."""
        return self.active in self.mixtures

    def routing(self) -> MixedForward | None:
        """How a forward runs when the weights are wrapped with a mixture now (it routes each forward's
        tokens), or None."""
        if self._applied is None or self._applied not in self.mixtures:
            return None
        return MixedForward(self, self.mixtures[self._applied])

    def shared_layers(self, a: WeightsIdentity, b: WeightsIdentity) -> int:
        """How many decoder layers, from the bottom, compute the same under identities a and b: those
        below the lowest layer either adapter changes (none after a merge in between)."""
        count = len(self.weights.layers)
        if a == b:
            return count
        if a.merges != b.merges:
            return 0
        return min(self._lowest.get(a.uid, count), self._lowest.get(b.uid, count))

    def _identity_of(self, name: str | None) -> WeightsIdentity:
        adapter = (self.adapters.get(name) or self.mixtures.get(name)) if name is not None else None
        return (
            WeightsIdentity(self.merges, name, adapter.uid, adapter.version)
            if adapter
            else WeightsIdentity(self.merges, name, 0, 0)
        )

    def merge(self, name: str, sign: float = 1.0) -> None:
        """Add (sign=+1) or subtract (-1) adapter `name`'s scale * B @ A into the float32 base weights, in
        place. No adapter stays active: a merged one would count twice."""
        adapter = self.get(name)
        adapter.ungated("merging into the weights")
        with self.lock:
            self.activate(None)
            for module in adapter.A:
                matrix = linear_of(self.weights, module).matrix
                if not isinstance(matrix, DenseMatrix):
                    assert isinstance(matrix, Int8Matrix)  # (none is applied: a quantized compute form)
                    raise InvalidArgumentError(f"merging needs float32 weights; {module} computes as {matrix.form}")
            for module in adapter.A:
                lin = linear_of(self.weights, module)
                dense = lin.matrix
                assert isinstance(dense, DenseMatrix)  # (checked above)
                if dense is self.weights.embed_tokens:  # a tied output projection gets its own copy first
                    copy = DenseMatrix(dense.weight.copy(), dense.kernel)
                    copy.use_provider(dense.provider)  # its products run where the original's did
                    lin.matrix = dense = copy
                # (where the kernel thread pool holds the weights, np.asarray copies them out of its memory)
                weight = np.asarray(dense.weight)
                weight += np.float32(sign * adapter.config.scale) * (adapter.B[module] @ adapter.A[module])
                dense.weight = weight
                dense.use_provider(dense.provider)  # a provider may compute from a copy (the kernel thread pool)
            self.merges += 1


class MixedForward:
    """A forward through weights an X-LoRA mixture mixes per token: a scaling pass with constant scalings,
    the routing from that pass's final hidden states, then the pass that counts. The scaling pass keeps
    its own cache entries per main cache (`AdapterSet.scaling_caches`), rewound with it."""

    def __init__(self, adapters: AdapterSet, mixture: Mixture) -> None:
        self.adapters, self.mixture = adapters, mixture

    def hidden(self, engine: Engine, tokens: np.ndarray, start: int, cache: Cache) -> np.ndarray:
        """The last layer's output (T, D) for tokens at positions start.., entries added to `cache`."""
        if not isinstance(cache, KVCache):  # (a paged sequence has no side cache for the scaling pass)
            raise InvalidArgumentError("an X-LoRA mixture computes one sequence at a time, not in a batch")
        if start < len(cache.tokens):
            cache.truncate(start)  # rewinding
        side = self.adapters.scaling_caches.get(cache)
        if side is None:
            side = self.adapters.scaling_caches[cache] = KVCache(engine.config, cache.max_positions, cache.options)
        fed, at = tokens, start
        if side.tokens[:start] != cache.tokens[:start]:  # it missed positions: it catches up
            side.reset()
            fed, at = np.concatenate([np.asarray(cache.tokens[:start], np.int64), tokens]), 0
        elif len(side.tokens) > start:
            side.truncate(start)
        self.mixture.constant(len(fed))
        h = hidden(engine.model, fed, at, side)[-len(tokens) :]  # (T, D)
        self.mixture.route(rms_norm(h, engine.weights.norm, engine.config.rms_norm_eps))
        return hidden(engine.model, tokens, start, cache)
