"""The torch backend against the attention conformance suite, plus what is specific to it."""

from __future__ import annotations

import pytest
import torch
from minisgl_plugin_torch.backend import TorchAttentionBackend, TorchAttentionMetadata

from minisgl_core.testing.attention_suite import LAYER, AttentionBackendSuite, Shape
from minisgl_core.testing.paged import store_prefixes


class TestTorchBackend(AttentionBackendSuite):
    backend_cls = TorchAttentionBackend
    device = "cpu"
    dtype = torch.float32
    atol = 1e-5
    rtol = 1e-5

    def test_registered_under_torch(self) -> None:
        from minisgl_core.testing.attention_suite import registered_attention_backend

        assert registered_attention_backend("torch") is TorchAttentionBackend

    def test_metadata_layout(self, generator: torch.Generator) -> None:
        """Padding repeats each row's first slot, and padded query rows never have an empty mask."""
        seq_lens, extend_lens = [5, 12, 1], [2, 12, 1]
        problem = self.make_problem(Shape(2, 2, 64, 4), seq_lens, generator)
        batch = self.batch(problem, generator, seq_lens, extend_lens)
        problem.backend.prepare_metadata(batch)
        meta: TorchAttentionMetadata = batch.attn_metadata
        table = batch.page_table[batch.req_slots.long()].long()
        assert meta.kv_slots.shape == (3, 12)
        for i, n in enumerate(seq_lens):
            assert torch.equal(meta.kv_slots[i, :n], table[i, :n])
            assert bool((meta.kv_slots[i, n:] == table[i, 0]).all())
        assert meta.max_extend == 12
        assert meta.token_seq.tolist() == [0, 0] + [1] * 12 + [2]
        assert meta.token_offset.tolist() == [0, 1] + list(range(12)) + [0]
        assert bool(meta.mask.any(dim=-1).all())
        # Sequence 0's new tokens sit at positions 3 and 4.
        assert meta.mask[0, 0, 0].tolist() == [True] * 4 + [False] * 8
        assert meta.mask[0, 0, 1].tolist() == [True] * 5 + [False] * 7

    def test_half_precision_inputs(self, generator: torch.Generator) -> None:
        """bf16 q/k/v and pool: computed in float32, returned in bf16."""
        seq_lens, extend_lens = [20, 7], [4, 1]
        self.dtype = torch.bfloat16  # instance attribute: this test only
        problem = self.make_problem(Shape(2, 4, 64, 16), seq_lens, generator)
        batch = self.batch(problem, generator, seq_lens, extend_lens)
        store_prefixes(problem.config.kv_cache, LAYER, batch, problem.keys[LAYER], problem.values[LAYER])
        self.atol = self.rtol = 1e-2
        self.run_step(problem, generator, batch)

    def test_unequal_sequences_run_one_by_one(self, generator: torch.Generator, monkeypatch) -> None:
        """A long prompt beside short ones and decode rows (a mixed step): most of the padded grid
        is padding, so each prompt runs alone and each run of decode rows together (checked
        against the suite's reference)."""
        from minisgl_plugin_torch import backend

        if torch.device(self.device).type != "cpu":
            pytest.skip("the CPU's path (on a GPU the padded grid is one kernel)")
        seq_lens, extend_lens = [9, 60, 1 + 30, 14, 22, 5], [1, 60, 30, 1, 1, 3]
        assert backend._mostly_padding(extend_lens, seq_lens)
        assert not backend._mostly_padding([4, 4], [9, 9])
        each, calls = TorchAttentionBackend._each, []
        monkeypatch.setattr(TorchAttentionBackend, "_each", lambda s, *a: calls.append(1) or each(s, *a))
        self.single_step(Shape(2, 8, 64, 4), generator, seq_lens, extend_lens)
        assert calls

    def test_decode_rows_of_unlike_lengths_run_in_groups(
        self, generator: torch.Generator, monkeypatch
    ) -> None:
        """A decode batch of one long sequence beside short ones: rows attend in groups of like
        widths (each padded to at most twice its own), checked against the suite's reference."""
        from minisgl_plugin_torch import backend

        if torch.device(self.device).type != "cpu":
            pytest.skip("the CPU's path (on a GPU the padded grid is one kernel)")
        seq_lens = [7, 300, 12, 150, 9, 80]
        assert backend._width_groups(seq_lens) == [([1, 3], 300), ([5], 80), ([2, 4, 0], 12)]
        assert backend._width_groups([5, 9, 6]) == [([0, 1, 2], 9)]  # alike: one group, in order
        widths = []
        decode = TorchAttentionBackend._decode
        monkeypatch.setattr(
            TorchAttentionBackend,
            "_decode",
            lambda s, q, k, *a: widths.append(k.shape[1]) or decode(s, q, k, *a),
        )
        self.single_step(Shape(2, 8, 64, 4), generator, seq_lens, [1] * len(seq_lens), is_prefill=False)
        assert widths == [300, 80, 12]

    @pytest.mark.parametrize("threshold", [0, 1 << 40], ids=["head-by-head", "all-heads"])
    def test_decode_attends_head_by_head_or_all_at_once(
        self, generator: torch.Generator, monkeypatch, threshold: int
    ) -> None:
        """A CPU decode step attends one KV head at a time from ``_HEAD_BY_HEAD_ELEMENTS``
        gathered elements on, else all heads in one product: both against the suite's reference,
        GQA groups of 1 and 4, with a step of one sequence (always all heads) beside."""
        from minisgl_plugin_torch import backend

        if torch.device(self.device).type != "cpu":
            pytest.skip("the CPU's path")
        monkeypatch.setattr(backend, "_HEAD_BY_HEAD_ELEMENTS", threshold)
        loops = []
        bmm = torch.bmm
        monkeypatch.setattr(backend.torch, "bmm", lambda *a, **k: loops.append(1) or bmm(*a, **k))
        for shape in (Shape(2, 2, 64, 4), Shape(4, 1, 32, 16)):
            for seq_lens in ([37, 5, 19, 64], [23]):
                loops.clear()
                self.single_step(shape, generator, seq_lens, [1] * len(seq_lens), is_prefill=False)
                # a group of one sequence attends all heads at once whatever the threshold
                assert bool(loops) == (threshold == 0 and len(seq_lens) > 1), (shape, seq_lens, len(loops))

    def test_ignores_positions_past_page_table_row(self, generator: torch.Generator) -> None:
        """Garbage (even out-of-range slot ids) past each sequence's length is never gathered."""
        seq_lens = [6, 3]
        problem = self.make_problem(Shape(1, 1, 64, 1), seq_lens, generator)
        batch = self.batch(problem, generator, seq_lens, [1, 1], is_prefill=False)
        for row, n in zip(batch.req_slots.long().tolist(), seq_lens, strict=True):
            batch.page_table[row, n:] = 10**6
        store_prefixes(problem.config.kv_cache, LAYER, batch, problem.keys[LAYER], problem.values[LAYER])
        self.run_step(problem, generator, batch)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
class TestTorchBackendCuda(TestTorchBackend):
    device = "cuda"


def test_random_page_table_layout() -> None:
    """Whole pages per sequence, disjoint, not in pool order; rows distinct; tails point at spare pages."""
    from minisgl_core.testing.paged import random_page_table

    capacities, page_size = [33, 1, 16, 70], 16
    layout = random_page_table(
        capacities,
        page_size=page_size,
        num_pages=20,
        max_requests=6,
        max_context_len=96,
        generator=torch.Generator().manual_seed(3),
    )
    rows = layout.req_slots.long().tolist()
    assert len(set(rows)) == len(rows)
    owned: list[int] = []
    for row, capacity in zip(rows, capacities, strict=True):
        slots = layout.page_table[row].long()
        width = -(-capacity // page_size) * page_size
        pages = slots[:width].view(-1, page_size)
        assert bool((pages == pages[:, :1] + torch.arange(page_size)).all()), "pages must be contiguous"
        assert bool((pages[:, 0] % page_size == 0).all())
        owned += slots[:width].tolist()
    assert len(set(owned)) == len(owned), "sequences share slots"
    tails = torch.cat(
        [
            layout.page_table[row, -(-c // page_size) * page_size :].long()
            for row, c in zip(rows, capacities, strict=True)
        ]
    )
    assert not set(tails.tolist()) & set(owned), "stale entries must not point into live pages"
    first_pages = [layout.page_table[row, 0].item() // page_size for row in rows]
    assert first_pages != sorted(first_pages), "pages should come in random order"
