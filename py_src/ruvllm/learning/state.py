"""What an adapter keeps between lessons: Adam's moments and step count, and the elastic weight
consolidation terms (the Fisher information of past lessons and the parameters they ended at), and
the lessons themselves (`memory`), which later lessons rehearse.

Keys are the adapter's parameter names (`<module>.lora_A`, `<module>.lora_B`). In an adapter folder
the state is `learning_state.safetensors`, with entries `adam.m.<key>`, `adam.v.<key>`, `adam.t`,
`fisher.<key>`, `anchor.<key>`, `basis.<module>` (learning/projection.py), `keys.used` (a keyed adapter's
rows of A given to lessons), and `memory.tokens` (every lesson's ids, concatenated), `memory.lengths`,
`memory.prompt_lengths`, `memory.rewards`, `memory.rows` (each lesson's rows of A: start, stop; -1 none).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

Arrays = dict[str, np.ndarray]


@dataclass
class Adam:
    """Adam (beta1 0.9, beta2 0.999, eps 1e-8), updating parameters in place."""

    m: Arrays = field(default_factory=dict)  # first moments
    v: Arrays = field(default_factory=dict)  # second moments
    t: int = 0  # steps taken, over every lesson

    def update(self, params: Arrays, grads: Arrays, lr: float) -> None:
        self.t += 1
        for key, theta in params.items():
            g = grads[key]
            m = self.m.setdefault(key, np.zeros_like(theta))
            v = self.v.setdefault(key, np.zeros_like(theta))
            m *= 0.9
            m += 0.1 * g
            v *= 0.999
            v += 0.001 * g * g
            theta -= lr * (m / (1 - 0.9**self.t)) / (np.sqrt(v / (1 - 0.999**self.t)) + 1e-8)


def sgd(params: Arrays, grads: Arrays, lr: float) -> None:
    for key, theta in params.items():
        theta -= lr * grads[key]


@dataclass
class Consolidation:
    """Elastic weight consolidation: a new lesson is pulled towards where earlier lessons left each
    parameter (`anchor`), as strongly as those lessons cared about it (`fisher`)."""

    fisher: Arrays = field(default_factory=dict)
    anchor: Arrays = field(default_factory=dict)

    def pulled(self, grads: Arrays, params: Arrays, strength: float) -> Arrays:
        """grads plus the gradient of strength / 2 * sum fisher * (theta - anchor)^2."""
        return {
            key: g + strength * self.fisher[key] * (params[key] - self.anchor[key]) if key in self.fisher else g
            for key, g in grads.items()
        }

    def consolidate(self, params: Arrays, grads: Arrays, decay: float) -> None:
        """Add a lesson: its Fisher information (squared log-likelihood gradients), anchored here."""
        for key, theta in params.items():
            fisher = grads[key] ** 2
            self.fisher[key] = fisher if key not in self.fisher else decay * self.fisher[key] + fisher
            self.anchor[key] = theta.copy()


@dataclass(frozen=True)
class Memory:
    """A lesson learned, kept so that later lessons can rehearse it: its token ids, how many of them
    are the prompt, and its reward."""

    tokens: tuple[int, ...]
    prompt_length: int
    reward: float


@dataclass
class LearningState:
    adam: Adam = field(default_factory=Adam)
    ewc: Consolidation = field(default_factory=Consolidation)
    memory: list[Memory] = field(default_factory=list)  # lessons learned, oldest first
    bases: Arrays = field(default_factory=dict)  # by module: the input subspace A stays out of (projection.py)
    # A keyed adapter (learn.py, keyed lessons): the rows of A given to lessons so far (None: not keyed,
    # A trains), and each lesson's rows (start, stop) by (its tokens, its prompt length)
    keyed: int | None = None
    rows: dict[tuple[tuple[int, ...], int], tuple[int, int]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.adam.t or self.ewc.fisher or self.memory or self.bases or self.keyed is not None)

    def grow(self, extra: int) -> None:
        """What it keeps per parameter, for an adapter grown by `extra` rows of A and columns of B (zero:
        no moments, no Fisher information, anchored at zero)."""
        for arrays in (self.adam.m, self.adam.v, self.ewc.fisher, self.ewc.anchor):
            for key, value in arrays.items():
                if key.endswith(".lora_A") or key.endswith(".lora_B"):
                    axis = 0 if key.endswith(".lora_A") else 1
                    pad = [(0, 0), (0, 0)]
                    pad[axis] = (0, extra)
                    arrays[key] = np.pad(value, pad)

    def tensors(self) -> Arrays:
        """The entries of learning_state.safetensors."""
        out = {f"adam.m.{k}": v for k, v in self.adam.m.items()}
        out |= {f"adam.v.{k}": v for k, v in self.adam.v.items()}
        out |= {f"fisher.{k}": v for k, v in self.ewc.fisher.items()}
        out |= {f"anchor.{k}": v for k, v in self.ewc.anchor.items()}
        out |= {f"basis.{k}": v for k, v in self.bases.items()}
        if self.adam.t:
            out["adam.t"] = np.array([self.adam.t], np.float32)
        if self.memory:  # token ids < 2^24 are exact in float32
            out["memory.tokens"] = np.concatenate([np.asarray(m.tokens) for m in self.memory])
            out["memory.lengths"] = np.array([len(m.tokens) for m in self.memory])
            out["memory.prompt_lengths"] = np.array([m.prompt_length for m in self.memory])
            out["memory.rewards"] = np.array([m.reward for m in self.memory])
            out["memory.rows"] = np.array([self.rows.get((m.tokens, m.prompt_length), (-1, -1)) for m in self.memory])
        if self.keyed is not None:
            out["keys.used"] = np.array([self.keyed])
        return {k: np.asarray(v, dtype=np.float32) for k, v in out.items()}

    @classmethod
    def from_tensors(cls, tensors: Arrays) -> LearningState:
        def group(prefix: str) -> Arrays:
            return {k[len(prefix) :]: v.astype(np.float32) for k, v in tensors.items() if k.startswith(prefix)}

        t = int(tensors["adam.t"][0]) if "adam.t" in tensors else 0
        memory, rows = [], {}
        if "memory.tokens" in tensors:
            ids = [int(v) for v in tensors["memory.tokens"]]
            ends = np.cumsum(tensors["memory.lengths"]).astype(int)
            prompts, rewards = tensors["memory.prompt_lengths"], tensors["memory.rewards"]
            for i, end in enumerate(ends):
                begin = end - int(tensors["memory.lengths"][i])
                memory.append(Memory(tuple(ids[begin:end]), int(prompts[i]), float(rewards[i])))
                if "memory.rows" in tensors and tensors["memory.rows"][i][0] >= 0:
                    start, stop = (int(v) for v in tensors["memory.rows"][i])
                    rows[memory[-1].tokens, memory[-1].prompt_length] = (start, stop)
        adam = Adam(group("adam.m."), group("adam.v."), t)
        keyed = int(tensors["keys.used"][0]) if "keys.used" in tensors else None
        ewc = Consolidation(group("fisher."), group("anchor."))
        return cls(adam, ewc, memory, group("basis."), keyed, rows)
