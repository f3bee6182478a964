"""The attention conformance suite on the Triton decode backend: on a GPU as it is; on the CPU
under Triton's interpreter, in a child process (``TRITON_INTERPRET`` must be set before Triton is
imported), where the suite classes below run again with the variable set. Without a GPU or the
interpreter the backend is unavailable and the suite classes skip.

Two configurations: the backend as shipped (small batches split the KV only when the GPU would
sit idle) and one that always splits (the partial outputs and their merge), over bf16 and float8
pools (the suite's "kv_fp8" test), page sizes 1 and 16, GQA groups 1 to 8."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch
from minisgl_plugin_triton.backend import TritonDecodeBackend

from minisgl_core import environment
from minisgl_core.api import SharedPrefix
from minisgl_core.testing.attention_suite import AttentionBackendSuite, Shape
from minisgl_core.testing.triton_interpreter import run_under_interpreter

pytest.importorskip("triton")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


class AlwaysSplitting(TritonDecodeBackend):
    """Asks for more programs than there are, so the suite's batches split their KV (4 ways for
    16 sequences of 2 KV heads on the interpreter's 4 "SMs"; some splits of short ones empty),
    and cuts cascade groups into tasks of a few members (2 at a GQA group of 8: the suite's groups
    of 3 and 4 become two tasks each).

    At most 8 splits of a sequence and 4 of a shared prefix (the rule alone asks for up to 32 of
    either at the suite's batch sizes): a split covers whole blocks of the kernel's loop (64
    positions over a bf16 pool, 128 over float8), so at the suite's lengths (at most 150) only the
    first 3 splits of either read anything whether there are 4 or 32; the rest are empty
    programs, which cost the interpreter nearly as much as full ones. With the caps every split
    test still has empty splits, a cascade step still 8 + 4 entries to merge (not a power of two),
    and the small batches 8 splits where the unsplit class has 2 or 4."""

    programs_per_sm = 32
    prefix_rows = 16

    def splits(self, batch_size: int) -> int:
        return min(8, super().splits(batch_size))

    def prefix_splits(self, batch_size: int) -> int:
        return min(4, super().prefix_splits(batch_size))


class TestTritonDecode(AttentionBackendSuite):
    backend_cls = TritonDecodeBackend
    device = DEVICE
    dtype = torch.bfloat16
    # GQA groups 1 to 8 on a GPU; under the interpreter (CI's minutes) 1, 2 and 8
    gqa_ratios = (1, 2, 4, 8) if DEVICE == "cuda" else (1, 2, 8)
    max_seq_len = 150  # more than two of the kernel's 64-position blocks


class TestTritonDecodeSplitting(TestTritonDecode):
    backend_cls = AlwaysSplitting

    def shapes(self) -> list[Shape]:
        """GQA groups 1 and 8 and page sizes 1 and 16 each once, not their product: the splits and
        the cascade tasks are the same code at either page size (the unsplit class runs the
        product), and under the interpreter each of these shapes costs seconds in CI."""
        return [Shape(self.num_kv_heads, 1, 128, 1), Shape(self.num_kv_heads, 8, 128, 16)]


class EarlyKV(AlwaysSplitting):
    """Prefetches each program's first two blocks of K and V into L2 before the point where,
    launched with PDL (fast path ``pdl_attention``, on by default on Hopper, where the other
    classes prefetch one block), it waits for the kernel before it (``early_kv``, compiled for CUDA
    only; on other GPUs without the wait). Splitting, so some programs read nothing."""

    early_kv = True
    early_blocks = 2


@pytest.mark.skipif(DEVICE != "cuda", reason="the prefetch is inline PTX: CUDA only")
class TestTritonDecodeEarly(TestTritonDecodeSplitting):
    backend_cls = EarlyKV


def test_the_split_rule():
    from minisgl_plugin_triton.backend import MAX_SPLITS, splits_for

    # Qwen3-0.6B (8 KV heads) on 132 SMs, 4 programs per SM: a full batch does not split
    assert splits_for(256, 8, 132, 4) == 1
    assert splits_for(66, 8, 132, 4) == 1  # 528 programs: exactly 4 per SM
    assert splits_for(65, 8, 132, 4) == 2
    assert splits_for(1, 8, 132, 4) == MAX_SPLITS  # batch 1: 66 wanted, capped
    assert splits_for(16, 8, 132, 4) == 8  # 4.1 wanted: the next power of two
    for bs in range(1, 300):
        s = splits_for(bs, 8, 132, 4)
        assert s & (s - 1) == 0 and 1 <= s <= MAX_SPLITS


def test_a_bf16_pool_splits_below_five_programs_an_sm():
    """The rule each pool's launch gives on an H200 (132 SMs) at Qwen3's 8 KV heads: a bf16 pool
    splits from 82 sequences down (656 programs; two splits read a layer 10% faster than one at
    77 sequences of an offline run's lengths, the same at 111), a float8 pool from 65 down."""
    from minisgl_plugin_triton.backend import splits_for

    bf16, fp8 = TritonDecodeBackend.launches[2], TritonDecodeBackend.launches[1]
    assert [splits_for(bs, 8, 132, bf16.programs_per_sm) for bs in (83, 82, 77, 66)] == [1, 2, 2, 2]
    assert [splits_for(bs, 8, 132, fp8.programs_per_sm) for bs in (83, 77, 66, 65)] == [1, 1, 1, 2]


@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_the_wide_launch_takes_small_batches_of_a_bf16_pool(kv_dtype):
    from minisgl_core.api import AttentionConfig, KVCache

    kv_heads = 2
    cache = KVCache(num_layers=1, num_pages=4, page_size=16, num_kv_heads=kv_heads, head_dim=64,
                    dtype=kv_dtype, device="cpu")  # fmt: skip
    config = AttentionConfig(num_qo_heads=4, num_kv_heads=kv_heads, head_dim=64, scale=0.125, page_size=16,
                             dtype=torch.bfloat16, device=torch.device("cpu"), max_requests=64,
                             max_context_len=64, kv_cache=cache)  # fmt: skip
    backend = TritonDecodeBackend(config)
    # fewer than wide_below (3) sequence x KV-head pairs on each of the interpreter's 4 "SMs"
    # (batches up to 5), split 4 ways at most (from 3 up: 1 and 2 split 16 and 8 ways)
    assert backend.num_sms * TritonDecodeBackend.wide_below == 12
    picked = [backend.decode_launch(bs, backend.splits(bs)).block_n for bs in (1, 2, 3, 5, 6, 64)]
    if kv_dtype == torch.bfloat16:
        assert [backend.splits(bs) for bs in (1, 2, 3, 5, 6)] == [16, 8, 4, 2, 2]
        assert picked == [64, 64, 128, 128, 64, 64]
    else:  # a float8 pool has one launch
        assert picked == [TritonDecodeBackend.launches[1].block_n] * 6


@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_gqa_groups_of_eight_split_less_over_a_bf16_pool(kv_dtype):
    """At Qwen3-30B-A3B's 32 query and 4 KV heads on an H200's 132 SMs a bf16 pool aims for three
    programs an SM and takes the wide launch below five (the sweep in the rule's comment: unsplit
    at 153 sequences, two splits at 77); Qwen3-0.6B's groups of two keep five and three, and a
    float8 pool keeps its launch's rule whatever the group."""
    from minisgl_plugin_triton.backend import splits_for

    from minisgl_core.api import AttentionConfig, KVCache

    def backend(q_heads, kv_heads):
        cache = KVCache(num_layers=1, num_pages=4, page_size=16, num_kv_heads=kv_heads, head_dim=64,
                        dtype=kv_dtype, device="cpu")  # fmt: skip
        config = AttentionConfig(num_qo_heads=q_heads, num_kv_heads=kv_heads, head_dim=64, scale=0.125,
                                 page_size=16, dtype=torch.bfloat16, device=torch.device("cpu"), max_requests=8,
                                 max_context_len=64, kv_cache=cache)  # fmt: skip
        b = TritonDecodeBackend(config)
        b.num_sms = 132
        return b

    wide, narrow = backend(32, 4), backend(16, 8)
    sizes = (256, 165, 153, 77, 40)
    if kv_dtype == torch.float8_e4m3fn:
        fp8 = TritonDecodeBackend.launches[1].programs_per_sm
        assert [wide.splits(bs) for bs in sizes] == [splits_for(bs, 4, 132, fp8) for bs in sizes]
        return
    assert [wide.splits(bs) for bs in sizes] == [1, 1, 1, 2, 4]
    assert [wide.decode_launch(bs, wide.splits(bs)).block_n for bs in sizes] == [64, 64, 128, 128, 128]
    assert [narrow.splits(bs) for bs in sizes] == [1, 1, 1, 2, 4]  # five an SM: as before
    assert [narrow.decode_launch(bs, narrow.splits(bs)).block_n for bs in sizes] == [64, 64, 64, 64, 128]


def test_cascade_plan():
    from minisgl_plugin_triton.backend import cascade_plan

    seq_lens = [40, 70, 35, 90, 20, 50]
    groups = [SharedPrefix(1, 4, 32), SharedPrefix(4, 6, 16)]
    order, skip, first, count, length = cascade_plan(seq_lens, groups, members_per_task=2)
    assert skip == [0, 32, 32, 32, 16, 16]
    own = [n - k for n, k in zip(seq_lens, skip)]
    assert sorted(order) == list(range(6)) and [own[i] for i in order] == sorted(own, reverse=True)
    # the group of three is two tasks; columns past the last task are empty
    assert (first, count, length) == ([1, 3, 4, 0, 0, 0], [2, 1, 2, 0, 0, 0], [32, 32, 16, 0, 0, 0])
    assert cascade_plan(seq_lens, [], 2)[1:] == [[0] * 6] * 4
    with pytest.raises(ValueError, match="overlap"):
        cascade_plan(seq_lens, [SharedPrefix(0, 3, 16), SharedPrefix(2, 4, 16)], 2)
    with pytest.raises(ValueError, match="outside"):
        cascade_plan(seq_lens, [SharedPrefix(5, 7, 16)], 2)
    with pytest.raises(ValueError, match="not shorter"):
        cascade_plan(seq_lens, [SharedPrefix(4, 6, 20)], 2)


def test_an_eager_steps_plan_rows_start_aligned_at_any_batch_size():
    """Triton compiles another kernel for a pointer not 16-byte aligned or a stride not divisible
    by 16: an eager step's plan (a split mixed step's decode rows, any number of them) is padded
    to 16 columns, as the graphs' buffers are, so its rows never ask for one."""
    from minisgl_plugin_triton.backend import TritonDecodeBackend

    backend = TritonDecodeBackend.__new__(TritonDecodeBackend)
    backend.config = SimpleNamespace(max_sequences=42, sliding_window=0)  # type: ignore[assignment]
    backend.members_per_task = 2
    backend.splits = backend.prefix_splits = lambda bs: 1  # type: ignore[method-assign]

    class Batch:
        is_prefill = False

        def __init__(self, seq_lens: list[int], groups: list[SharedPrefix] | None) -> None:
            self.batch_size, self.seq_lens_cpu, self.extend_lens_cpu = (
                len(seq_lens),
                seq_lens,
                [1] * len(seq_lens),
            )
            self.seq_lens = torch.tensor(seq_lens, dtype=torch.int32)
            self.req_slots = torch.arange(len(seq_lens), dtype=torch.int32)
            self.shared_prefixes = groups

    for bs in (1, 5, 17, 42):
        lens = [20 + i for i in range(bs)]
        for groups in (None, [SharedPrefix(0, bs, 16)]):
            batch = Batch(lens, groups)
            backend.prepare_metadata(batch)  # type: ignore[arg-type]
            meta = batch.attn_metadata
            rows = [meta.order] if groups is None else [meta.order, meta.skip, *meta.tasks]
            assert all(row.data_ptr() % 64 == 0 for row in rows), bs
            assert sorted(meta.order[:bs].tolist()) == list(range(bs))  # the plan, then zeros
            assert not meta.order[bs:].any()
            if groups is not None:
                assert meta.tasks.stride(0) % 16 == 0
                assert meta.skip[:bs].tolist() == [16] * bs


def test_partial_outputs_hold_a_speculative_verify_step():
    """A verify step holds 1 + drafts sequences a request: the partial outputs are sized by
    ``max_sequences`` (until API 2.2 by ``max_requests``, and a verify step wrote past them), and a
    step beyond it is refused before any kernel runs."""
    from minisgl_core.api import AttentionConfig, KVCache

    cache = KVCache(num_layers=1, num_pages=4, page_size=16, num_kv_heads=3, head_dim=64,
                    dtype=torch.bfloat16, device="cpu")  # fmt: skip
    common = dict(num_qo_heads=9, num_kv_heads=3, head_dim=64, scale=0.125, page_size=16,
                  dtype=torch.bfloat16, device=torch.device("cpu"), max_context_len=64, kv_cache=cache)  # fmt: skip
    assert AttentionConfig(**common, max_requests=3).max_sequences == 3  # built without it: one a request
    with pytest.raises(ValueError, match="below max_requests"):
        AttentionConfig(**common, max_requests=3, max_sequences=2)
    backend = TritonDecodeBackend(AttentionConfig(**common, max_requests=3, max_sequences=15))
    for bs in range(1, 16):
        entries = bs * (backend.splits(bs) + backend.prefix_splits(bs)) * 9
        assert backend.partial_lse.numel() >= entries and backend.partial.numel() >= entries * 64
    rows = torch.zeros(16, dtype=torch.int32)
    plan = torch.zeros(5, 16, dtype=torch.int32)
    with pytest.raises(ValueError, match="16 sequences is more than the 15"):
        backend._metadata(rows, rows, plan, 16)


def test_decode_only_steps_are_refused_clearly():
    backend = TritonDecodeBackend.__new__(TritonDecodeBackend)

    class Batch:
        is_prefill = True
        extend_lens_cpu = [5]

    with pytest.raises(ValueError, match="--attn fi,triton"):
        backend.prepare_metadata(Batch())  # type: ignore[arg-type]


@pytest.mark.skipif(DEVICE == "cuda", reason="on a GPU the suite classes run directly")
@pytest.mark.skipif(environment.triton_interpreter(), reason="this is the interpreter's child process")
def test_suite_under_the_interpreter():
    out = run_under_interpreter(__file__)
    assert " passed" in out and "failed" not in out, out[-3000:]


if __name__ == "__main__":  # the child process: the suite classes under the interpreter
    sys.exit(pytest.main([__file__, "-q", "-p", "no:cacheprovider", "-k", "TestTritonDecode"]))
