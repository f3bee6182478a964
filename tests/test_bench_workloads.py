"""The benchmark workloads are the ones BENCHMARKS.md and the peer's driver measure: the standard
offline workload's totals, and how another ``--num-requests`` draws its own requests."""

from __future__ import annotations

from minisgl_core.bench.workloads import shared_prefix, standard_offline


def test_the_standard_workload_has_the_totals_the_peer_checks():
    requests = standard_offline()
    assert len(requests) == 256
    assert sum(len(r.prompt_ids) for r in requests) == 142_827
    assert sum(r.max_tokens for r in requests) == 133_966
    assert all(100 <= len(r.prompt_ids) <= 1024 and 100 <= r.max_tokens <= 1024 for r in requests)


def test_another_size_shares_the_prompts_but_draws_its_own_output_lengths():
    """Every prompt is drawn before the first output length (nano-vllm's order): n requests have
    the 256's first n prompts but not their output lengths, as ``--num-requests``'s help says."""
    small, standard = standard_offline(8), standard_offline()[:8]
    assert [r.prompt_ids for r in small] == [r.prompt_ids for r in standard]
    assert [r.max_tokens for r in small] != [r.max_tokens for r in standard]
    assert standard_offline(8) == small  # the same seed, the same requests


def test_shared_prefix_groups_share_their_prefix_and_interleave():
    requests = shared_prefix(groups=3, prompts_per_group=2, prefix_len=5, question_len=2, output_len=4)
    assert len(requests) == 6 and all(len(r.prompt_ids) == 7 and r.max_tokens == 4 for r in requests)
    prefixes = [tuple(r.prompt_ids[:5]) for r in requests]
    assert prefixes[:3] == prefixes[3:] and len(set(prefixes)) == 3  # group 0, 1, 2, then again
