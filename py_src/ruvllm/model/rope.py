"""Rotary position embeddings, Hugging Face layout (rotate the two halves of each head).

Dimension letters: T positions, E head size.

GGUF `llama` files permute the rows of Wq and Wk for ggml's interleaved RoPE; the converter undoes
that permutation, so every model computes RoPE this one way.
"""

from __future__ import annotations

import numpy as np

from .config import ModelConfig


def inverse_frequencies(config: ModelConfig) -> list[np.ndarray]:
    """Each layer's theta^(-2i/E) for i < E/2 (E/2,), adjusted by the config's RoPE scaling. Layers that
    share frequencies share one array; Gemma 3's sliding-window layers have their own base, unscaled."""
    full = _frequencies(config.head_dim, config.rope_theta, config.rope_scaling)
    if config.local_rope_theta is None:
        return [full] * config.num_hidden_layers
    local = _frequencies(config.head_dim, config.local_rope_theta, None)
    return [full if window is None else local for window in config.sliding_windows]


def _frequencies(E: int, theta: float, scaling: dict | None) -> np.ndarray:
    inv = 1.0 / theta ** (np.arange(0, E, 2, dtype=np.float64) / E)  # (E/2,)
    if scaling is None:
        return inv
    if scaling["rope_type"] == "linear":
        return inv / scaling["factor"]
    # llama3: long wavelengths slowed by `factor`, short ones kept, a smooth ramp in between.
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    original = scaling["original_max_position_embeddings"]
    wavelength = 2 * np.pi / inv  # (E/2,)
    scaled = np.where(wavelength > original / low, inv / factor, inv)  # (E/2,)
    ramp = (original / wavelength - low) / (high - low)  # (E/2,)
    smoothed = (1 - ramp) * scaled / factor + ramp * scaled  # (E/2,)
    medium = (wavelength >= original / high) & (wavelength <= original / low)
    return np.where(medium, smoothed, scaled)


def rope_tables(inv_freq: np.ndarray, start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin for positions start .. start+count-1, each (T, E/2) float32."""
    return rope_tables_at(inv_freq, np.arange(start, start + count))


def rope_tables_at(inv_freq: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin for any positions (T,) (a batch of sequences, each at its own place), each (T, E/2)."""
    angles = np.asarray(positions, dtype=np.float64)[:, None] * inv_freq[None, :]  # (T, E/2)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate x (heads, T, E): pairs are (x[i], x[i + E/2])."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]  # (heads, T, E/2)
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)  # (heads, T, E)
