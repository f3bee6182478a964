"""Request seeds on the CPU: all 64 bits count, and seeds below 2**32 draw as they always did."""

from __future__ import annotations

import pytest
import torch

from minisgl_core import SamplingParams
from minisgl_core.runner.sampler import Sampler, SampleRequest

VOCAB = 1000
#: each pair differed only above bit 31, and so drew the same tokens on the CPU
SAME_LOW_BITS = [(-1, 2**32 - 1), (2**63 - 1, -1), (-(2**32) - 1, 2**32 - 1), (0, -(2**63)), (1, 2**32 + 1)]


def _tokens(sampler: Sampler, seed: int, steps: int = 64) -> list[int]:
    """``steps`` tokens drawn at temperature 1 from uniform logits with the seed's generator."""
    generator = sampler.make_generator(seed)
    logits = torch.zeros(1, VOCAB)
    request = SampleRequest(SamplingParams(temperature=1.0, seed=seed), [], generator)
    return [int(sampler.sample(logits, [request]).token_ids[0]) for _ in range(steps)]


@pytest.mark.parametrize(("seed", "other"), SAME_LOW_BITS)
def test_seeds_differing_above_32_bits_sample_differently(seed, other):
    sampler = Sampler(VOCAB, torch.device("cpu"))
    # 64 draws of 1,000 equally likely tokens: a chance match is 1e-192
    assert _tokens(sampler, seed) != _tokens(sampler, other)


@pytest.mark.parametrize("seed", [0, 1, 42, 2**31, 2**32 - 1])
def test_seeds_below_2_32_keep_their_draws(seed):
    sampler = Sampler(VOCAB, torch.device("cpu"))
    plain = torch.Generator().manual_seed(seed)
    assert torch.equal(
        torch.rand(256, generator=sampler.make_generator(seed)), torch.rand(256, generator=plain)
    )
