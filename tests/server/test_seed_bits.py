"""A request's seed counts whole on the CPU server: seeds that differ only above bit 31 drew the
same text, since the CPU's mt19937 keeps 32 bits of the seed."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(("seed", "other"), [(-1, 2**32 - 1), (0, -(2**63)), (2**63 - 1, -1)])
def test_seeds_differing_above_32_bits_give_different_text(client, model_name, seed, other):
    def tokens(s: int) -> list[str]:
        resp = client.completions.create(
            model=model_name, prompt="Once", max_tokens=32, temperature=1.0, seed=s, logprobs=0,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        return resp.choices[0].logprobs.tokens

    first = tokens(seed)
    assert tokens(seed) == first  # (still reproducible)
    assert tokens(other) != first
