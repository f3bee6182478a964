"""The engine gives the same greedy tokens whatever the batching, chunking, paging and caching."""

from __future__ import annotations

import gc
import json
import logging
import os
import random

import pytest
import torch

from minisgl_core import SamplingParams
from minisgl_core.demo.factories import make_model_dir
from minisgl_core.testing import assert_kv_released, cpu_llm

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(
        tmp_path_factory.mktemp("m") / "qwen3", "Qwen3ForCausalLM", max_position_embeddings=512
    )


@pytest.fixture(scope="module")
def prompts():
    rng = random.Random(0)
    # mixed lengths; every fourth shares a 40-token prefix with the others in its group
    shared = [rng.randrange(5, 1000) for _ in range(40)]
    out = []
    for i in range(32):
        tail = [rng.randrange(5, 1000) for _ in range(rng.randrange(1, 60))]
        out.append(shared + tail if i % 4 == 0 else tail)
    return out


@pytest.fixture(scope="module")
def reference(model_dir, prompts):
    """Each prompt alone, no prefix cache, one page per token, no chunking."""
    llm = cpu_llm(model_dir, cache="naive")
    return [llm.generate([p], GREEDY)[0].token_ids for p in prompts]


def test_reference_is_not_degenerate(reference):
    # the tiny random model must produce varied tokens, or the comparisons below prove nothing
    assert len({t for ids in reference for t in ids}) > 50


@pytest.mark.parametrize(
    "options",
    [
        dict(cache="naive"),
        dict(cache="radix"),
        dict(cache="radix", max_prefill_tokens=7),  # tiny budget: every prompt is chunked
        dict(cache="radix", page_size=16),
        dict(cache="naive", page_size=16, max_prefill_tokens=33),
        dict(cache="radix", max_running_requests=5),  # more requests than slots: they queue
    ],
    ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()),
)
def test_batched_equals_alone(model_dir, prompts, reference, options):
    llm = cpu_llm(model_dir, **options)
    outs = llm.generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == reference
    assert all(o.finish_reason == "length" for o in outs)
    # second round: with radix the shared prefixes (and whole prompts) now come from the cache
    again = llm.generate(prompts, GREEDY)
    assert [o.token_ids for o in again] == reference
    stats = llm.engine.stats()
    if options["cache"] == "radix":
        assert stats["cached_prompt_tokens"] > sum(len(p) for p in prompts) // 2
    else:
        assert stats["cached_prompt_tokens"] == 0
    assert_kv_released(llm)


def test_memory_pressure_evicts_and_queues_but_never_loses(model_dir, prompts, reference):
    # room for only a few requests at a time: the cache must evict, requests must wait their turn
    llm = cpu_llm(model_dir, cache="radix", num_kv_tokens=256)
    for _ in range(2):
        outs = llm.generate(prompts, GREEDY)
        assert [o.token_ids for o in outs] == reference
        assert_kv_released(llm)
    llm.engine.scheduler.kv.cache.check_integrity()


def test_request_too_large_for_pool_is_rejected(model_dir):
    llm = cpu_llm(model_dir, num_kv_tokens=64)
    with pytest.raises(ValueError, match="exceeds the KV pool"):
        llm.generate([[5] * 60], SamplingParams(max_tokens=10))
    with pytest.raises(ValueError, match="context length 512"):
        llm.generate([[5] * 500], SamplingParams(max_tokens=20))


def test_prompt_is_shared_while_its_request_still_decodes(model_dir):
    shared = list(range(100, 164))
    first, second = shared + [7, 8, 9, 10, 11, 12], shared + [20, 21, 22, 23, 24]
    alone = cpu_llm(model_dir, cache="naive")
    expected = [alone.generate([p], GREEDY)[0].token_ids for p in (first, second)]
    # a 70-token budget prefills `first` alone in step one; `second` is admitted in step two,
    # while `first` is decoding (it finishes only after 12 tokens)
    llm = cpu_llm(model_dir, cache="radix", max_prefill_tokens=70)
    outs = llm.generate([first, second], GREEDY)
    assert [o.token_ids for o in outs] == expected
    assert llm.engine.stats()["cached_prompt_tokens"] == len(shared)
    assert_kv_released(llm)
    llm.engine.scheduler.kv.cache.check_integrity()


@pytest.mark.parametrize("page_size", [1, 4])
def test_requests_sharing_a_prompt_in_one_step_compute_it_once(model_dir, page_size):
    """n choices of one prompt, or a burst of prompts sharing a long prefix, arriving together and
    all fitting one prefill step: the first computes the shared part, the others wait a round
    and read it from the cache (the first's prompt is offered to it once planned), each output
    as it is alone. An unrelated prompt is not held back."""
    shared = list(range(100, 164))
    prompts = [shared + [7, 8], shared + [20, 21, 22], shared + [7, 8], [300 + i for i in range(10)]]
    alone = cpu_llm(model_dir, cache="naive")
    expected = [alone.generate([p], GREEDY)[0].token_ids for p in prompts]
    llm = cpu_llm(model_dir, cache="radix", page_size=page_size)
    taken = []  # the prompts each prefill (or mixed) step admits or continues
    take = llm.engine.scheduler._take_chunks
    llm.engine.scheduler._take_chunks = lambda plan, budget: taken.append(t := take(plan, budget)) or t
    outs = llm.generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == expected
    # the second reads the 64 shared tokens; the third, the first's whole prompt, all of it but the
    # page holding its last token (whose logits it must compute)
    usable = [64, (len(prompts[2]) - 1) // page_size * page_size]
    assert llm.engine.stats()["cached_prompt_tokens"] == sum(usable)
    steps = [[r.rid for r in t[0]] for t in taken if t is not None]
    first = min(min(step) for step in steps)  # the requests' rids follow the prompts' order
    assert [[rid - first for rid in step] for step in steps] == [[0, 3], [1, 2]]
    assert_kv_released(llm)
    llm.engine.scheduler.kv.cache.check_integrity()


def test_a_prompt_sharing_only_tokens_past_another_prefix_is_not_held_back(model_dir):
    """The same 40 tokens at the same positions but behind another cached prefix share no K/V:
    such a request is admitted with the prompt that has them, not a round later."""
    system, other, middle = list(range(100, 164)), list(range(400, 464)), list(range(600, 640))
    llm = cpu_llm(model_dir, cache="radix")
    llm.generate([system + [5]], GREEDY)  # the system prompt in the cache
    taken = []
    take = llm.engine.scheduler._take_chunks
    llm.engine.scheduler._take_chunks = lambda plan, budget: taken.append(t := take(plan, budget)) or t
    outs = llm.generate([other + middle + [7], system + middle + [8]], GREEDY)
    assert all(len(o.token_ids) == GREEDY.max_tokens for o in outs)
    assert [len(t[0]) for t in taken if t is not None] == [2]  # one step admits both
    assert_kv_released(llm)


@pytest.mark.parametrize(
    ("page_size", "params"),
    [
        (1, SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)),
        (4, SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)),
        # seeded sampling draws from each request's own generator: retraction must not disturb it
        (1, SamplingParams(temperature=1.0, top_k=50, max_tokens=60, ignore_eos=True, seed=7)),
    ],
    ids=["greedy-page1", "greedy-page4", "seeded"],
)
def test_retraction_when_decode_outgrows_the_pool(model_dir, page_size, params):
    rng = random.Random(3)
    prompts = [[rng.randrange(5, 1000) for _ in range(30)] for _ in range(6)]
    alone = cpu_llm(model_dir, cache="naive")
    expected = [alone.generate([p], params)[0].token_ids for p in prompts]
    # 90 tokens per request and room for 256: admission expects only part of max_tokens, so
    # three start together, outgrow the pool, and the newest is retracted and resumed later
    llm = cpu_llm(model_dir, cache="radix", num_kv_tokens=256, page_size=page_size)
    outs = llm.generate(prompts, params)
    assert [o.token_ids for o in outs] == expected
    assert llm.engine.stats()["retractions"] >= 1
    assert_kv_released(llm)
    llm.engine.scheduler.kv.cache.check_integrity()


@pytest.mark.parametrize("overlap", [True, False])
def test_length_limited_requests_are_not_decoded_past_their_last_token(
    model_dir, prompts, reference, overlap
):
    """With overlap the scheduler plans a step before the previous one's tokens land; it must still
    not decode a request whose step in flight already samples its last token (max_tokens)."""
    llm = cpu_llm(model_dir, cache="radix", overlap=overlap, max_running_requests=12)
    decode_rows: list[int] = []
    schedule = llm.engine.scheduler.schedule

    def recording():
        batch = schedule()
        if batch is not None:  # a decode step's requests, a mixed step's decode rows
            decode_rows.append(batch.decodes if batch.forward.is_prefill else len(batch.requests))
        return batch

    llm.engine.scheduler.schedule = recording
    outs = llm.generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == reference
    # the prefill samples the first token, one decode row per further token: 11 each, none wasted
    # (12 rows for 32 requests: requests are admitted while others decode, in mixed steps)
    assert sum(decode_rows) == len(prompts) * (GREEDY.max_tokens - 1)
    assert_kv_released(llm)


def test_step_trace_of_an_offline_run(model_dir, prompts, reference, tmp_path, monkeypatch):
    """MINISGL_STEP_TRACE is written by the engine itself, so offline runs (and each TP rank 0 of
    the offline TP benchmark) are traced like the server: every step once, tokens as launched."""
    path = tmp_path / "steps.jsonl"
    monkeypatch.setenv("MINISGL_STEP_TRACE", str(path))
    llm = cpu_llm(model_dir, cache="naive", max_prefill_tokens=256)
    monkeypatch.delenv("MINISGL_STEP_TRACE")
    outs = llm.generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == reference
    steps = [json.loads(line) for line in path.read_text().splitlines()]
    assert sum(s["new"] for s in steps) == len(prompts)
    prefill = [s for s in steps if s.get("kind") in ("prefill", "mixed")]
    decode = [s for s in steps if s.get("kind") == "decode"]
    assert all(s.get("decodes", 0) == 0 for s in steps if s.get("kind") != "mixed")
    # a mixed step's tokens: its decode rows, then its prompt tokens
    prompt_tokens = sum(s["tokens"] - s.get("decodes", 0) for s in prefill)
    assert prompt_tokens == sum(len(p) for p in prompts)  # no prefix cache
    assert max(s["tokens"] for s in prefill) <= 256 and len(prefill) > 1  # chunked
    decode_rows = sum(s["tokens"] for s in decode) + sum(s.get("decodes", 0) for s in prefill)
    assert decode_rows == len(prompts) * (GREEDY.max_tokens - 1)
    assert any(s["kind"] == "mixed" and 0 < s["decodes"] < s["tokens"] for s in steps)
    assert all(s["dt"] >= 0 for s in steps)
    assert [s["t"] for s in steps] == sorted(s["t"] for s in steps)
    # planning a step, in parts: each step kind's own, adding up to no more than the whole
    parts = {"plan", "admit", "lists", "rows", "pack", "copy", "index"}
    for s in prefill + decode:
        got = {k.removeprefix("schedule."): v for k, v in s["ms"].items() if k.startswith("schedule.")}
        assert set(got) == (parts | {"cache"} if s["kind"] != "decode" else parts), s
        assert all(v >= 0 for v in got.values()) and sum(got.values()) <= s["ms"]["schedule"] + 0.01, s


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_a_step_trace_that_cannot_be_written_stops_the_trace_not_the_engine(
    model_dir, prompts, reference, caplog
):
    """A write that failed (a full disk; /dev/full opens, as the start-up check tries, and takes no
    byte) raised out of the step, its outputs lost: `serve --step-trace /dev/full` went down on its
    first request with the scheduler's OSError traceback. The trace stops, said once; the run goes on."""
    llm = cpu_llm(model_dir, cache="naive", step_trace="/dev/full")
    with caplog.at_level(logging.WARNING, logger="minisgl_core.engine.engine"):
        outs = llm.generate(prompts, GREEDY)
    assert [o.token_ids for o in outs] == reference
    assert [r.getMessage() for r in caplog.records if "step trace" in r.getMessage()] == [
        "the step trace /dev/full (--step-trace) cannot be written to: No space left on device; "
        "no more steps are traced"
    ]


def test_batch_tensors_start_16_byte_aligned(model_dir):
    """Every per-step tensor the scheduler hands the model starts 16-byte aligned whatever the
    token count: Triton compiles a separate kernel variant for an unaligned pointer, which on the
    GPU was a 0.6-1 s compile in the middle of a run at the first odd-sized prefill (positions were
    row 1 of one int64 pack, at byte 8 * tokens)."""
    llm = cpu_llm(model_dir, cache="naive")
    seen: list[tuple[int, dict[str, int]]] = []
    prepare = llm.engine.runner.prepare

    def recording_prepare(batch):
        fields = ("positions", "out_cache_loc", "req_slots", "seq_lens", "extend_lens")
        seen.append((len(batch.extend_lens_cpu), {f: getattr(batch, f).data_ptr() % 16 for f in fields}))
        return prepare(batch)

    llm.engine.runner.prepare = recording_prepare
    outs = llm.generate(
        [[11, 12, 13, 14, 15, 16, 17], [21, 22, 23]], SamplingParams(max_tokens=3, temperature=0.0)
    )
    assert [len(o.token_ids) for o in outs] == [3, 3]
    assert seen and all(offsets == dict.fromkeys(offsets, 0) for _, offsets in seen), seen


def test_start_up_objects_are_frozen_until_the_engine_closes(model_dir):
    """The collector's full passes skip what start-up built (a full one over it stalled a GPU step
    for 347 ms), and a closed engine lets it be collected again."""
    gc.unfreeze()
    llm = cpu_llm(model_dir)
    frozen = gc.get_freeze_count()
    assert frozen > 10_000  # torch, the model, the tokenizer
    llm.generate([[1, 2, 3]], SamplingParams(max_tokens=4), use_tqdm=False)
    assert gc.get_freeze_count() > frozen - 1000  # still frozen (a few freed by reference count)
    llm.close()
    assert gc.get_freeze_count() == 0


@pytest.mark.parametrize("page_size, mixed", [(1, False), (4, True), (16, False)])
def test_allocated_slots_follow_each_position_to_its_page(model_dir, prompts, page_size, mixed):
    """``KVManager.allocate`` builds a chunk's slots a page at a time; every slot must be what the
    position names: ``pages[(pos - prefix) // page] * page + (pos - prefix) % page``, for chunks
    that start mid-page (a 22-token prefill budget), after cached prefixes, and for decode steps."""
    from minisgl_core.scheduler.kv import KVManager

    llm = cpu_llm(model_dir, cache="radix", page_size=page_size, mixed_batch=mixed, max_prefill_tokens=22)
    kv = llm.engine.scheduler.kv
    allocate = KVManager.allocate.__get__(kv)
    checked: list[int] = []

    def by_position(req, end):
        start = req.num_computed
        slots = allocate(req, end)
        if slots is not None:
            base, pages = req.prefix_len, req.pages
            expected = [
                pages[(p - base) // page_size] * page_size + (p - base) % page_size for p in range(start, end)
            ]
            assert slots == expected, (start, end, base)
            checked.append((end - start, base))
        return slots

    kv.allocate = by_position
    llm.generate(prompts[:12], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))
    lengths = {n for n, _ in checked}
    assert max(lengths) > page_size and 1 in lengths and any(base > 0 for _, base in checked)
    assert_kv_released(llm)


@pytest.mark.parametrize("page_size, mixed", [(1, False), (4, True)])
def test_available_pages_kept_within_a_round_equals_the_full_sum(model_dir, prompts, page_size, mixed):
    """Admission asks for the pages still promisable at every admission of a prefill step; the
    KV manager sums the admitted requests' expected growth once a round and updates it as
    admissions, allocations, prompt caching and releases change single requests. Under memory
    pressure (evictions, retractions, shared prefixes moving into the cache) every answer must
    equal the sum taken from scratch, and each request's share of the sum kept the pages the
    documented rule gives it: those its expected final length (what it has plus the reserve ratio
    of what it may add, at least one token past what it must fill) spans past its cached prefix's
    whole pages and the pages it holds."""
    import math

    from minisgl_core.scheduler.kv import KVManager

    llm = cpu_llm(model_dir, cache="radix", num_kv_tokens=256, page_size=page_size, mixed_batch=mixed)
    kv = llm.engine.scheduler.kv
    kept = KVManager.available_pages.__get__(kv)
    answers: list[tuple[int, int]] = []
    growths: list[tuple[dict[int, int], dict[int, int]]] = []

    def rule(r) -> int:
        out, ps = len(r.output_ids), page_size
        final = max(
            len(r.prompt_ids) + out + math.ceil(kv.reserve_ratio * (r.params.max_tokens - out)),
            r.fill_len + 1,
        )
        return max(0, math.ceil(final / ps) - r.prefix_len // ps - len(r.pages))

    def checked() -> int:
        fast = kept()
        growths.append((dict(kv._growth), {rid: rule(r) for rid, r in kv.admitted.items()}))
        saved = (kv._growth, kv._growth_total)
        kv._forget_growth()
        answers.append((fast, kept()))
        kv._growth, kv._growth_total = saved
        return fast

    kv.available_pages = checked
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    llm.generate(prompts[:16], params)
    assert len(answers) > 50 and llm.engine.stats()["retractions"] >= 1
    assert [fast for fast, _ in answers] == [full for _, full in answers]
    assert [summed for summed, _ in growths] == [each for _, each in growths]
    assert any(summed and any(summed.values()) for summed, _ in growths)
    assert_kv_released(llm)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_int_tensor_equals_torch_tensor(dtype):
    """The scheduler's lists reach torch through an array (three times faster than torch.tensor
    for a prefill step's thousands of ints): the same values, dtype and shape, and an error,
    not a wrapped value, for an int out of range."""
    import random

    from minisgl_core.runner.sampler import int_tensor

    info = torch.iinfo(dtype)
    rng = random.Random(0)
    values = [info.min, info.max, 0, -1, 1] + [rng.randint(info.min, info.max) for _ in range(9000)]
    got = int_tensor(values, dtype)
    assert got.dtype == dtype and torch.equal(got, torch.tensor(values, dtype=dtype))
    assert torch.equal(int_tensor([], dtype), torch.tensor([], dtype=dtype))
    with pytest.raises(OverflowError):
        int_tensor([info.max + 1], dtype)


@pytest.mark.parametrize("length", [0, 1, 7, 8, 9, 16, 8191])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float32])
def test_aligned_rows_are_the_rows_each_on_whole_64_byte_lines(length, dtype):
    from minisgl_core.runner.sampler import aligned_rows

    rows = [list(range(r * 10_000, r * 10_000 + length)) for r in range(3)]
    got = aligned_rows(rows, dtype)
    width = got.shape[1]
    assert got.shape[0] == 3 and width >= length and (width * got.element_size()) % 64 == 0
    assert width - length < 64 // got.element_size()
    assert torch.equal(got[:, :length], torch.tensor(rows, dtype=dtype).view(3, length))
    assert not got[:, length:].any()


@pytest.mark.parametrize("lengths", [(0, 0, 0), (1, 3, 1), (7, 2, 9), (9, 17, 33), (8191, 5, 8191)])
def test_rows_to_device_gives_each_block_as_aligned_rows_gives_it(lengths):
    """Blocks of int64, int32 and float32 rows through one copy: each comes back with the values,
    dtype and shape ``aligned_rows`` gives it alone, and every row of every block starts on a
    64-byte line of the one buffer (as Triton's pointer arguments need)."""
    from minisgl_core.runner.sampler import aligned_rows, rows_to_device

    a, b, c = lengths
    blocks = [
        ([list(range(a)), [-(2**40) - i for i in range(a)]], torch.int64),
        ([[i * 3 for i in range(b)]] * 3, torch.int32),
        ([[0.5 * i for i in range(c)]], torch.float32),
    ]
    got = rows_to_device(blocks, torch.device("cpu"))
    base = got[0].data_ptr()
    for tensor, (rows, dtype) in zip(got, blocks, strict=True):
        alone = aligned_rows(rows, dtype)
        assert tensor.dtype == dtype and torch.equal(tensor, alone) and tensor.is_contiguous()
        for row in tensor:
            assert (row.data_ptr() - base) % 64 == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_rows_to_device_packs_queued_behind_work_keep_their_own_values():
    """Packs of different sizes sent one after another while a sleeping kernel holds the stream
    (so none of their copies has run when its host tensor is freed and the next pack is built)
    each arrive with their own values: a pageable copy is staged before it returns."""
    from minisgl_core.runner.sampler import aligned_rows, rows_to_device

    device = torch.device("cuda")
    sizes = [8192, 100, 40_000, 8192, 3]
    packs = [
        [([list(range(k * 7, k * 7 + n))] * 2, torch.int64), ([[k] * n], torch.int32)]
        for k, n in enumerate(sizes)
    ]
    torch.cuda._sleep(50_000_000)
    got = [rows_to_device(blocks, device) for blocks in packs]
    torch.cuda.synchronize()
    for blocks, tensors in zip(packs, got, strict=True):
        for tensor, (rows, dtype) in zip(tensors, blocks, strict=True):
            assert torch.equal(tensor.cpu(), aligned_rows(rows, dtype))


@pytest.mark.parametrize("page_size", [1, 4])
def test_start_up_runs_one_prefill_into_the_reserved_slot_only(model_dir, page_size):
    """Start-up runs one prefill through the model and its attention (so kernels built on first
    use, FlashInfer's JIT on a GPU, are built before the first request) on a dummy token: its K/V
    land in the reserved slot that padded graph replays write to, and nowhere the scheduler owns."""
    llm = cpu_llm(model_dir, page_size=page_size)
    runner = llm.engine.runner
    kv = runner.kv_cache
    for layer in range(kv.num_layers):
        for cache in (kv.k_cache(layer), kv.v_cache(layer)):
            written = cache.reshape(kv.num_slots, -1).abs().sum(-1).nonzero().flatten().tolist()
            assert written == [runner.dummy_slot]
    assert runner.dummy_slot >= runner.usable_kv_pages * page_size
    out = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))
    assert len(out[0].token_ids) == 3


def test_step_outputs_and_request_views_are_their_named_tuples_whole(model_dir):
    """``Scheduler.process`` and ``Request.view`` make their NamedTuples by ``tuple.__new__`` (no
    Python-level call a request a step): each is the tuple its class makes of the same fields by
    name, every field in its place (a field added to the class must be added there too)."""
    from minisgl_core.api import RequestView
    from minisgl_core.sampling import StepOutput
    from minisgl_core.scheduler.request import Request

    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    req = Request(7, [5, 6, 7, 8], params, arrival=4, priority=3)
    req.num_computed, req.output_ids = 2, [9]
    view = req.view()
    assert type(view) is RequestView and view.remaining_prefill == 2
    assert view == RequestView(
        rid=7, arrival=4, prompt_len=4, num_computed=2, output_len=1, max_new_tokens=2, priority=3
    )
    llm = cpu_llm(model_dir)
    engine = llm.engine
    engine.add_request(1, [5, 6, 7], engine.admit([5, 6, 7], params))
    outputs = []
    while engine.has_work:
        outputs += engine.step()
    assert all(type(o) is StepOutput and len(o) == len(StepOutput._fields) for o in outputs)
    assert outputs == [
        StepOutput(rid=1, token_id=o.token_id, finished=last, finish_reason="length" if last else None,
                   cached_tokens=0 if first else None)
        for o, first, last in zip(outputs, [True, False, False], [False, False, True], strict=True)
    ]  # fmt: skip
    llm.close()


def test_a_batchs_sampled_requests_are_its_own_list_when_every_one_is_sampled():
    """The engine reads a step's sampled requests twice a step (its sampling, its grammars): a
    decode step's are its whole list, given as it is; a prefill step's are those whose prompt the
    step completes, in their order."""
    from minisgl_core.scheduler.request import Request
    from minisgl_core.scheduler.scheduler import ScheduledBatch

    a, b, c = (Request(i, [1, 2, 3, 4], SamplingParams(), 0) for i in range(3))
    decode = ScheduledBatch(None, [a, b, c], [1, 1, 1], [0, 1, 2])
    assert decode.sampled_requests() is decode.requests
    prefill = ScheduledBatch(None, [a, b, c], [2, 4, 4], [1, 2])  # a's prompt is not whole yet
    assert prefill.sampled_requests() == [b, c]
    assert ScheduledBatch(None, [a], [2], []).sampled_requests() == []
