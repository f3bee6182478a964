"""Llama 3's rope scaling recovered from the per-frequency factors llama.cpp's converter stores.

A Llama 3.1 / 3.2 GGUF holds no rope-scaling metadata: the converter writes ``rope_freqs.weight``,
for each rotary frequency the divisor Llama 3's scaling applies to it (1 for short wavelengths,
``factor`` for long ones, a blend between). config.json states the four numbers the divisors come
from; this finds numbers that give exactly the file's divisors, so the model computes the same table.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

#: the values each parameter is searched over (Llama 3.1 and 3.2: low 1, high 4, 8,192 tokens)
_CONTEXTS = tuple(2**k for k in range(8, 21))
_LOW = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
_HIGH = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
#: relative agreement asked of every divisor (the file stores them as float32)
_TOLERANCE = 1e-5


def llama3_divisors(inv_freq: np.ndarray, factor: float, low: float, high: float, context: int) -> np.ndarray:
    """The divisor Llama 3's scaling applies to each inverse frequency."""
    wavelength = 2 * math.pi / inv_freq
    smooth = (context / wavelength - low) / (high - low)
    blended = 1.0 / ((1 - smooth) / factor + smooth)
    return np.where(wavelength < context / high, 1.0, np.where(wavelength > context / low, factor, blended))


def llama3_scaling_from_factors(factors: np.ndarray, theta: float, head_dim: int) -> dict[str, Any] | None:
    """config.json's ``rope_scaling`` (llama3) whose divisors are ``factors``; None when no
    parameters in the searched range give them (the file then holds some other scaling)."""
    if not np.all(np.isfinite(factors) & (factors > 0)):
        return None  # a divisor of 0 (or NaN) is no scaling at all
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    factor = float(factors.max())
    for context, low, high in itertools.product(_CONTEXTS, _LOW, _HIGH):
        if high <= low:
            continue
        divisors = llama3_divisors(inv_freq, factor, low, high, context)
        if np.all(np.abs(divisors - factors) <= _TOLERANCE * np.abs(factors)):
            return {
                "rope_type": "llama3",
                "factor": factor,
                "low_freq_factor": low,
                "high_freq_factor": high,
                "original_max_position_embeddings": context,
            }
    return None
