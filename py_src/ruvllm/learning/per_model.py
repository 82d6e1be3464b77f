"""What learning keeps per loaded model, beside the engine rather than inside it: the calibration
text's token ids (what adapters keep their inputs away from), the projection bases and spectra made from them and
the jobs making them (projection.py). Kept as long as the engine lives."""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import numpy as np

from ..runtime.engine import Engine


@dataclass(eq=False)
class ModelLearning:
    calibration_ids: list[int] | None = None  # token ids of the calibration text
    bases: dict[tuple, dict[str, np.ndarray]] = field(default_factory=dict)  # by projection._key: {module: basis}
    spectra: dict[tuple, dict] = field(default_factory=dict)  # by projection._key (no energy): {module: Spectrum}
    jobs: list = field(default_factory=list)  # projection.BasesJob under way, the next one first


_HELD: weakref.WeakKeyDictionary[Engine, ModelLearning] = weakref.WeakKeyDictionary()


def per_model(engine: Engine) -> ModelLearning:
    """Learning's state for `engine` (made empty on first use)."""
    held = _HELD.get(engine)
    if held is None:
        held = _HELD[engine] = ModelLearning()
    return held
