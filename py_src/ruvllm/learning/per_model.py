"""What learning keeps for one loaded model, held by its Session (session.py) beside the engine rather
than inside it: the calibration text's token ids (what adapters keep their inputs away from), the
projection bases and spectra made from them and the jobs making them (projection.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..runtime.engine import Engine


@dataclass(eq=False)
class ModelLearning:
    engine: Engine  # the model whose inputs these are
    calibration_ids: list[int] | None = None  # token ids of the calibration text
    bases: dict[tuple, dict[str, np.ndarray]] = field(default_factory=dict)  # by projection._key: {module: basis}
    spectra: dict[tuple, dict] = field(default_factory=dict)  # by projection._key (no energy): {module: Spectrum}
    jobs: list = field(default_factory=list)  # projection.BasesJob under way, the next one first
