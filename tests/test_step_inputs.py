"""What a step sends to the device: how many host-to-device copies a decode step makes, and (on
CUDA) that no batch size makes a Triton kernel compile after start-up, which a misaligned input
row does (Triton compiles a variant per 16-byte alignment of each pointer argument)."""

from __future__ import annotations

import pytest
import torch

from minisgl_core import SamplingParams
from minisgl_core.demo.factories import make_model_dir

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_a_decode_step_copies_one_host_array_to_the_device(tmp_path, monkeypatch):
    """A plain decode step of the requests the step before sampled sends the device one host
    array: the scheduler's one pack (slots, positions and rows as int64; rows, lengths and chunks,
    and the slots again, as int32). The sampler's two scale rows (one copy) go only when the
    sampled requests change: here the prefill step sampled the same three, so no decode step
    sends them. Its token inputs, logits rows and the rows its sampled tokens are stored at are
    read from tensors on the device already (there were seven copies, then three, then two)."""
    import minisgl_core.runner.layout as layout
    import minisgl_core.runner.sampler as sampler
    from minisgl_core.testing import cpu_llm

    copies: list[tuple[int, ...]] = []
    real = sampler.copy_to_device
    for module in (layout, sampler):
        monkeypatch.setattr(
            module,
            "copy_to_device",
            lambda host, device: copies.append(tuple(host.shape)) or real(host, device),
        )
    model = make_model_dir(tmp_path / "qwen3", "Qwen3ForCausalLM", max_position_embeddings=256)
    llm = cpu_llm(model)
    engine = llm.engine
    params = SamplingParams(temperature=0.8, max_tokens=6, ignore_eos=True)
    per_step, kinds = [], []
    step = engine.step

    def counting_step():
        before = len(copies)
        out = step()
        batch = engine.launched_last
        kinds.append(None if batch is None else (batch.kind, len(batch.requests)))
        per_step.append(len(copies) - before)
        return out

    monkeypatch.setattr(engine, "step", counting_step)
    outputs = llm.generate([[5, 6, 7, 8], [9, 10, 11], [12, 13]], params, use_tqdm=False)
    assert all(len(o.token_ids) == 6 for o in outputs)
    decode_counts = [n for n, kind in zip(per_step, kinds) if kind == ("decode", 3)]
    assert decode_counts and max(decode_counts) == 1, (per_step, kinds)


@cuda
def test_no_triton_kernel_compiles_after_start_up(tmp_path):
    """Batches of every size from 1 to 40, sampled and greedy, after the engine's start-up: no
    Triton kernel may compile (or load from Triton's disk cache) then, since each compile stalls
    the run for 0.6 s or more. A scale row that started 4 × batch-size bytes into its buffer did:
    the offline benchmark fell from 26.1k to 19.8k tok/s (BENCHMARKS.md, 2026-11-27). Then prefills
    of 512 tokens and more, where the tiled rope/KV-store kernel takes its second tile shape (the
    warm-up's long prefill compiles it), and whose token count is an int argument that Triton
    would specialize (1, a multiple of 16, other) had the kernel not opted out."""
    from triton import knobs

    from minisgl_core.llm import LLM

    model_dir = make_model_dir(tmp_path / "q", "Qwen3ForCausalLM", max_position_embeddings=1024)
    llm = LLM(model_dir, device="cuda", dtype="bfloat16", attn="torch", page_size=16, num_kv_tokens=65536)
    compiled: list[str] = []

    def hook(*, fn, **_) -> bool:
        compiled.append(fn.name)
        return False

    previous, knobs.runtime.jit_cache_hook = knobs.runtime.jit_cache_hook, hook
    try:
        for n in range(1, 41):
            prompts = [[3 + (i * 7 + j) % 500 for j in range(5 + i % 9)] for i in range(n)]
            temperature = 0.0 if n % 4 == 0 else 0.7
            params = SamplingParams(temperature=temperature, max_tokens=3, ignore_eos=True)
            llm.generate(prompts, params, use_tqdm=False)
        sampled = SamplingParams(temperature=0.7, max_tokens=3, ignore_eos=True)
        for lengths in ([600], [300, 300, 300], [700, 5, 9]):  # from 512 tokens on: rope's wide tiles
            prompts = [[3 + (i * 11 + j) % 500 for j in range(length)] for i, length in enumerate(lengths)]
            llm.generate(prompts, sampled, use_tqdm=False)
    finally:
        knobs.runtime.jit_cache_hook = previous
    assert compiled == [], sorted(set(compiled))


@cuda
def test_a_triton_decode_graph_replay_builds_no_layout(tmp_path, monkeypatch):
    """The Triton decode backend reads each sequence's slots from the page table itself, so a decode
    step that replays a CUDA graph builds no paged layout for it (a packed copy, two allocations and
    a kernel launch of host time a step, before ``FastLayoutBatch``); the prefill steps still do."""
    import minisgl_core.runner.cuda_graph as cuda_graph
    import minisgl_core.runner.layout as layout
    from minisgl_core.llm import LLM

    model_dir = make_model_dir(tmp_path / "q", "Qwen3ForCausalLM", max_position_embeddings=1024)
    llm = LLM(
        model_dir, device="cuda", dtype="bfloat16", attn="torch,triton", page_size=16, num_kv_tokens=65536
    )
    built, replays = [], []
    real_build, real_prepare = layout.build_layout, cuda_graph.GraphRunner.prepare
    monkeypatch.setattr(
        layout, "build_layout", lambda batch: built.append(batch.is_prefill) or real_build(batch)
    )
    monkeypatch.setattr(
        cuda_graph.GraphRunner, "prepare", lambda self, batch: replays.append(1) or real_prepare(self, batch)
    )
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    outputs = llm.generate([[3 + i, 9, 27, 81 % (i + 2)] for i in range(5)], params, use_tqdm=False)
    assert all(len(o.token_ids) == 8 for o in outputs)
    assert len(replays) >= 7, replays  # the decode steps replayed graphs
    assert False not in built, built  # no decode step built a layout


def test_step_inputs_convert_no_dtype_on_the_device(tmp_path, monkeypatch):
    """Planning a step runs no dtype conversion on the device: the page table's int32 entries come
    from an int32 copy of the slots and every gather or scatter by request row takes the int64
    rows (an int32 index makes ``aten::index``/``index_put_`` convert it first, a kernel of its own
    before each CUDA graph replay). Prefill, mixed and decode steps alike (a long prompt arriving
    while a short one decodes, chunked by a small budget), each request's greedy tokens those of
    the same run without the check."""
    from torch.profiler import profile

    import minisgl_core.scheduler.scheduler as scheduler
    from minisgl_core.testing import cpu_llm
    from minisgl_core.testing.engine_run import run_staggered

    model = make_model_dir(tmp_path / "qwen3", "Qwen3ForCausalLM", max_position_embeddings=256)
    greedy = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    arrivals = [(0, [5, 6, 7, 8], greedy), (2, list(range(20, 60)), greedy), (3, [12, 13], greedy)]
    options = dict(cache="naive", max_prefill_tokens=16, mixed_batch=True)
    expected = run_staggered(cpu_llm(model, **options), arrivals)

    seen: list[tuple[str, list[str]]] = []
    real = scheduler.Scheduler._forward_batch

    def watched(self, is_prefill, *args, decodes=0, **kw):
        with profile() as prof:
            out = real(self, is_prefill, *args, decodes=decodes, **kw)
        kind = "decode" if not is_prefill else ("mixed" if decodes else "prefill")
        seen.append((kind, [e.name for e in prof.events() if e.name == "aten::_to_copy"]))
        return out

    monkeypatch.setattr(scheduler.Scheduler, "_forward_batch", watched)
    run = run_staggered(cpu_llm(model, **options), arrivals)
    assert run.tokens == expected.tokens and all(len(t) == 8 for t in run.tokens.values())
    assert run.kinds == expected.kinds and run.count("mixed") >= 1
    assert {kind for kind, _ in seen} == {"prefill", "mixed", "decode"}, seen
    assert all(not converts for _, converts in seen), seen
