"""get_rope reads both config layouts and matches transformers' inverse frequencies."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from minisgl_core.layers import get_rope, rope_parameters

LLAMA3 = dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192)
BASE: dict[str, Any] = dict(hidden_size=4096, num_attention_heads=32, head_dim=128)


def transformers_inv_freq(rope_type: str, theta: float) -> torch.Tensor:
    extra = LLAMA3 if rope_type == "llama3" else {"factor": 4.0} if rope_type == "linear" else {}
    config = LlamaConfig(**BASE, rope_parameters={"rope_type": rope_type, "rope_theta": theta, **extra})
    if rope_type == "default":
        return 1.0 / (theta ** (torch.arange(0, 128, 2, dtype=torch.int64).float() / 128))
    return ROPE_INIT_FUNCTIONS[rope_type](config, "cpu")[0]


@pytest.mark.parametrize(
    "hf_config, rope_type, theta",
    [
        (
            {**BASE, "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, **LLAMA3}},
            "llama3",
            500000.0,
        ),
        (
            {**BASE, "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", **LLAMA3}},
            "llama3",
            500000.0,
        ),
        ({**BASE, "rope_theta": 500000.0, "rope_scaling": {"type": "llama3", **LLAMA3}}, "llama3", 500000.0),
        ({**BASE, "rope_theta": 1e6, "rope_scaling": {"rope_type": "linear", "factor": 4.0}}, "linear", 1e6),
        (
            {**BASE, "rope_parameters": {"rope_type": "linear", "rope_theta": 1e6, "factor": 4.0}},
            "linear",
            1e6,
        ),
        ({**BASE, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}, "default", 1e6),
        ({**BASE, "rope_theta": 1e6, "rope_scaling": None}, "default", 1e6),
        ({**BASE}, "default", 10000.0),
    ],
)
def test_inverse_frequencies_match_transformers(
    hf_config: dict[str, Any], rope_type: str, theta: float
) -> None:
    assert rope_parameters(hf_config)["rope_type"] == rope_type
    expected = transformers_inv_freq(rope_type, theta)
    torch.testing.assert_close(get_rope(hf_config, 128).inv_freq, expected, rtol=1e-6, atol=0)


def test_llama3_scaling_changes_only_long_wavelengths() -> None:
    scaled = get_rope(
        {**BASE, "rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, **LLAMA3}}, 128
    ).inv_freq
    plain = get_rope({**BASE, "rope_theta": 5e5}, 128).inv_freq
    assert torch.equal(scaled[:8], plain[:8])
    torch.testing.assert_close(scaled[-1], plain[-1] / 8)


def test_unsupported_rope_type_is_named() -> None:
    with pytest.raises(NotImplementedError, match="'yarn'"):
        get_rope({**BASE, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, 128)
