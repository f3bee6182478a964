"""Quantization on real weights: the default model (SmolLM2-135M-Instruct, float32, CPU) with
``--quantization int8`` and ``--quantization fp8`` against itself unquantized, on the real-model
chat prompts (``python -m minisgl_core.testing.quant_accuracy`` adds the fp8 KV pool).

Measured on 2026-11-25 (BENCHMARKS.md, "Quantization accuracy"): int8 agrees on 78.9% of greedy
tokens (mean |Δlogprob| 0.037), fp8 on 42.6% (0.089). The thresholds sit under those figures
with room for another CPU's summation order, so a change that makes a method clearly less
accurate fails. fp8 runs its CPU emulation, which rounds weights and activations as the GPU
kernel does.
"""

from __future__ import annotations

import pytest

from minisgl_core.testing.quant_accuracy import VARIANTS, Agreement, measure

#: label -> (least greedy agreement, largest mean |Δlogprob|) allowed
THRESHOLDS = {"int8": (0.70, 0.05), "fp8": (0.35, 0.12)}


@pytest.fixture(scope="module")
def results(default_model_dir) -> dict[str, Agreement]:
    variants = [v for v in VARIANTS if v[0] in THRESHOLDS]
    return {r.label: r for r in measure(default_model_dir, variants)}


@pytest.mark.parametrize("label", sorted(THRESHOLDS))
def test_quantized_greedy_output_stays_close_to_unquantized(results, label):
    result = results[label]
    least_agreement, largest_mean = THRESHOLDS[label]
    assert result.agreement >= least_agreement, result.row()
    assert result.mean_logprob_distance <= largest_mean, result.row()
    # and it really is another computation: some logprob moved
    assert result.max_logprob_distance > 0, result.row()
