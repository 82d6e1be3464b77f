"""What the forward computes with, as one object (llama2.c's `Transformer`): the blueprint, the weights,
and each layer's RoPE frequencies, derived from the blueprint once."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .config import ModelConfig
from .rope import inverse_frequencies
from .weights import Weights


@dataclass(frozen=True)
class Transformer:
    config: ModelConfig
    weights: Weights
    inv_freq: list[np.ndarray] = field(init=False, repr=False, compare=False)  # each layer's (E/2,)

    def __post_init__(self) -> None:
        object.__setattr__(self, "inv_freq", inverse_frequencies(self.config))
