"""Cascade attention in the core: page ranges, grouping decode requests by shared prefix, and
the engine giving the same tokens with cascade on and off."""

from __future__ import annotations

import random

import pytest
import torch

from minisgl_core import LLM, SamplingParams
from minisgl_core.api import SharedPrefix, paged_ranges
from minisgl_core.demo.factories import make_model_dir
from minisgl_core.scheduler import cascade
from minisgl_core.scheduler.cascade import common_prefix_len, group_shared_prefixes
from minisgl_core.scheduler.request import Request

# ---------------------------------------------------------------- paged_ranges


@pytest.mark.parametrize("page_size", [1, 4, 16])
def test_paged_ranges_lists_the_pages_of_each_range(page_size: int) -> None:
    rng = random.Random(page_size)
    num_rows, width = 6, 64
    # whole pages in random order; the slots of one page are contiguous, as the core keeps them
    pages = torch.randperm(num_rows * width // page_size).view(num_rows, -1)
    table = (pages[:, :, None] * page_size + torch.arange(page_size)).view(num_rows, width).to(torch.int32)
    rows, starts, ends = [], [], []
    for _ in range(9):
        rows.append(rng.randrange(num_rows))
        start = page_size * rng.randrange(width // page_size)
        starts.append(start)
        ends.append(rng.randrange(start, width + 1))  # empty ranges too
    got = paged_ranges(table, torch.tensor(rows), starts, ends, page_size)
    expected, indptr, last = [], [0], []
    for row, start, end in zip(rows, starts, ends, strict=True):
        pages = [int(table[row, pos]) // page_size for pos in range(start, end, page_size)]
        expected += pages
        indptr.append(indptr[-1] + len(pages))
        last.append((end - start - 1) % page_size + 1 if pages else 0)
    assert got.kv_indices.dtype == torch.int32
    assert got.kv_indices.tolist() == expected
    assert got.kv_indptr == indptr and got.kv_last_page_len == last


def test_paged_ranges_rejects_a_start_inside_a_page() -> None:
    with pytest.raises(ValueError, match="multiples of the page size"):
        paged_ranges(torch.zeros(2, 8, dtype=torch.int32), torch.tensor([0]), [3], [8], 4)


# ---------------------------------------------------------------- grouping


def running(rid: int, prefix: list[int], seq_len: int) -> tuple[Request, int]:
    req = Request(rid=rid, prompt_ids=[1] * seq_len, params=SamplingParams(), arrival=rid)
    req.prefix_slots = torch.tensor(prefix, dtype=torch.int64)
    req.prefix_len = len(prefix)
    req.num_computed = seq_len - 1  # (decoding its last token: seq_len tokens in the KV after it)
    return req, seq_len


def group(reqs_and_lens: list[tuple[Request, int]], page_size: int = 1):
    return group_shared_prefixes([r for r, _ in reqs_and_lens], page_size)


@pytest.fixture
def always_worth_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cascade, "MIN_SAVED_TOKENS", 0)
    monkeypatch.setattr(cascade, "MIN_SAVED_SHARE", 0.0)


def test_common_prefix_len() -> None:
    a = torch.tensor([5, 6, 7, 8])
    assert common_prefix_len(a, torch.tensor([5, 6, 9])) == 2
    assert common_prefix_len(a, torch.tensor([5, 6])) == 2
    assert common_prefix_len(a, torch.tensor([1])) == 0
    assert common_prefix_len(a, a.clone()) == 4


def test_groups_are_consecutive_and_lone_requests_follow(always_worth_it) -> None:
    shared_a, shared_b = list(range(100, 140)), list(range(200, 230))
    batch = [
        running(0, [], 50),  # no cached prefix
        running(1, shared_a + [1, 2], 60),
        running(2, shared_b + [9], 40),
        running(3, shared_a + [3], 45),
        running(4, list(range(300, 320)), 30),  # a prefix nobody else has
        running(5, shared_b, 35),
        running(6, shared_a, 41),
    ]
    reqs, groups = group(batch)
    assert [r.rid for r in reqs] == [1, 3, 6, 2, 5, 0, 4]
    assert groups == [SharedPrefix(0, 3, 40), SharedPrefix(3, 5, 30)]


def test_group_prefix_is_cut_to_pages_and_below_every_length(always_worth_it) -> None:
    shared = list(range(100, 137))  # 37 common slots
    _, groups = group([running(0, shared + [1, 2, 3], 80), running(1, shared + [4], 80)], page_size=8)
    assert groups == [SharedPrefix(0, 2, 32)]
    # a member whose whole sequence is the shared part keeps one token of its own
    _, groups = group([running(0, shared, 37), running(1, shared, 90)], page_size=1)
    assert groups == [SharedPrefix(0, 2, 36)]


def test_no_cascade_when_it_saves_too_little(monkeypatch: pytest.MonkeyPatch) -> None:
    shared = list(range(100, 140))
    batch = [running(0, shared, 50), running(1, shared, 50)]
    reqs, groups = group(batch)  # saves 40 reads, under MIN_SAVED_TOKENS
    assert groups is None and reqs == [r for r, _ in batch]
    monkeypatch.setattr(cascade, "MIN_SAVED_TOKENS", 40)
    assert group(batch)[1] == [SharedPrefix(0, 2, 40)]
    # ... and under the share: two 50-token requests plus a long lone one
    assert group([*batch, running(2, [], 1000)])[1] is None


def test_memo_follows_the_leader(always_worth_it) -> None:
    shared = list(range(100, 140))
    a, b, c = running(0, shared, 50), running(1, shared[:20] + [7] * 20, 50), running(2, shared, 50)
    assert group([a, b])[1] == [SharedPrefix(0, 2, 20)]
    assert b[0].shared_prefix_memo[0] is a[0].prefix_slots
    # a finishes; c leads now: b's length is measured against c, not taken from the memo
    assert group([c, b])[1] == [SharedPrefix(0, 2, 20)]
    assert b[0].shared_prefix_memo[0] is c[0].prefix_slots


# ---------------------------------------------------------------- the engine

GREEDY = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(
        tmp_path_factory.mktemp("m") / "qwen3", "Qwen3ForCausalLM", max_position_embeddings=512
    )


@pytest.mark.parametrize("page_size", [1, 4])
def test_engine_cascade_gives_the_same_tokens(model_dir, always_worth_it, page_size: int) -> None:
    rng = random.Random(page_size)
    systems = [[rng.randrange(5, 1000) for _ in range(rng.randrange(30, 70))] for _ in range(3)]
    prompts = [
        s + [rng.randrange(5, 1000) for _ in range(rng.randrange(1, 12))] for s in systems for _ in range(4)
    ]
    prompts += [[rng.randrange(5, 1000) for _ in range(20)] for _ in range(3)]  # lone ones
    rng.shuffle(prompts)

    def run(cascade_on: bool) -> tuple[list[list[int]], list[list[SharedPrefix]]]:
        llm = LLM(model_dir, device="cpu", dtype="float32", attn="torch", cache="radix",
                  page_size=page_size, cascade=cascade_on)  # fmt: skip
        seen: list[list[SharedPrefix]] = []
        scheduler = llm.engine.scheduler
        build = scheduler._build_decode

        def spy(plan):
            scheduled = build(plan)
            if scheduled is not None and scheduled.forward.shared_prefixes:
                seen.append(scheduled.forward.shared_prefixes)
            return scheduled

        scheduler._build_decode = spy  # type: ignore[method-assign]
        # the first request of each system prompt fills the cache; later ones share its KV
        return [o.token_ids for o in llm.generate(prompts, GREEDY)], seen

    plain, none_seen = run(False)
    tokens, seen = run(True)
    assert not none_seen
    assert len(seen) >= GREEDY.max_tokens - 1  # cascade ran on (nearly) every decode step
    assert max(len(groups) for groups in seen) == 3
    assert tokens == plain
