"""Tensor parallelism on CPU (gloo): two ranks give the same greedy tokens as one."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch.multiprocessing as mp

from minisgl_core.demo.factories import make_model_dir
from minisgl_core.distributed import join_parent_store, leave_parent_store_group, parent_store

PROMPTS = [[11, 12, 13, 14, 15], list(range(20, 70)), [7] * 9]


def _rank(rank: int, world: int, port: int, model_dir: str, queue, quantization: str | None = None) -> None:
    import torch.distributed as dist

    from minisgl_core.api import ParallelContext
    from minisgl_core.config import EngineConfig
    from minisgl_core.engine.engine import Engine
    from minisgl_core.sampling import SamplingParams
    from minisgl_core.testing import drain

    join_parent_store("gloo", rank, world, port)
    try:
        parallel = ParallelContext(rank, world, dist.group.WORLD)
        config = EngineConfig(model=model_dir, attn="torch", device="cpu", dtype="float32", tp_size=world,
                              quantization=quantization)  # fmt: skip
        engine = Engine(config, parallel)
        params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
        for rid, prompt in enumerate(PROMPTS):
            # the first also scores its prompt (prompt_logprobs: the whole vocabulary's logits)
            engine.add_request(rid, prompt, params if rid else dataclasses.replace(params, prompt_logprobs=2))
        tokens: dict[int, list[int]] = {rid: [] for rid in range(len(PROMPTS))}
        prompt_logprobs = None
        for out in drain(engine):
            tokens[out.rid].append(out.token_id)
            if out.prompt_logprobs is not None:
                prompt_logprobs = [(lp.logprob, [t for t, _ in lp.top]) for lp in out.prompt_logprobs[1:]]
        queue.put((rank, ([tokens[r] for r in range(len(PROMPTS))], prompt_logprobs)))
    finally:
        engine = parallel = None
        leave_parent_store_group()


def _spawn_ranks(target, world: int, *args) -> dict:
    """``target(rank, world, port, *args, queue)`` in ``world`` processes; the (rank, result) pairs
    they put on the queue, as a dict, once every one exited cleanly."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    store = parent_store(world)  # (kept until the ranks are done)
    procs = [ctx.Process(target=target, args=(r, world, store.port, *args, queue)) for r in range(world)]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=300) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return results


def _run(world: int, model_dir: str) -> dict[int, tuple[list[list[int]], list | None]]:
    return _spawn_ranks(_rank, world, model_dir)


def _rank_int8(rank: int, world: int, port: int, model_dir: str, queue) -> None:
    _rank(rank, world, port, model_dir, queue, quantization="int8")


@pytest.mark.parametrize(
    ("arch", "overrides"),
    [
        ("Qwen3ForCausalLM", {}),  # 4 q heads / 2 kv heads: 1 kv head per rank
        ("LlamaForCausalLM", {"num_key_value_heads": 1, "tie_word_embeddings": False, "vocab_size": 1027}),
        # each expert's intermediate size halved per rank, the router replicated, layer 1 dense
        ("Qwen3MoeForCausalLM", {"mlp_only_layers": [1]}),
        # q/k norms over whole projections: the ranks' sums of squares all-reduced (the one KV head
        # held by both ranks counted twice and divided out)
        ("Olmo2ForCausalLM", {"num_key_value_heads": 1}),
        # the final logit soft-cap on each rank's slice of the vocabulary (vocabulary-parallel
        # sampling), the attention soft-cap and (layer 0) a sliding window on each rank's heads
        (
            "Gemma2ForCausalLM",
            {
                "num_key_value_heads": 1,
                "tie_word_embeddings": False,
                "vocab_size": 1027,
                "attn_logit_softcapping": 2.0,
                "final_logit_softcapping": 3.0,
                "query_pre_attn_scalar": 8,
                "sliding_window": 6,
            },
        ),
        # per-head q/k norms (whole on each rank), layer 1 attends fully with its own rope (linearly
        # scaled), layers 0 and 2 slide a window of 6 with the local one; the final soft-cap
        (
            "Gemma3ForCausalLM",
            {
                "num_key_value_heads": 1,
                "tie_word_embeddings": False,
                "vocab_size": 1027,
                "num_hidden_layers": 3,
                "sliding_window_pattern": 2,
                "sliding_window": 6,
                "final_logit_softcapping": 3.0,
                "rope_parameters": {
                    "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                    "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                },
            },
        ),
    ],
    ids=[
        "qwen3-gqa",
        "llama-replicated-kv-odd-vocab",
        "qwen3-moe",
        "olmo2-replicated-kv",
        "gemma2-capped-windowed-replicated-kv-odd-vocab",
        "gemma3-two-ropes-windowed-replicated-kv-odd-vocab",
    ],
)
def test_tp2_equals_tp1(tmp_path, arch, overrides):
    model_dir = str(make_model_dir(tmp_path / "m", arch, **overrides))
    one, one_prompt = _run(1, model_dir)[0]
    two = _run(2, model_dir)
    assert two[0][0] == one and two[1][0] == one
    assert len({t for seq in one for t in seq}) > 5
    # the prompt's logprobs: every rank the same, as TP=1's (float32 sums in another order)
    assert len(one_prompt) == len(PROMPTS[0]) - 1
    for rank in (0, 1):
        for (a, top_a), (b, top_b) in zip(two[rank][1], one_prompt, strict=True):
            assert abs(a - b) < 1e-4 and top_a == top_b, (rank, a, b, top_a, top_b)


def test_tp2_with_int8_experts_stays_with_tp1(tmp_path):
    """Qwen3-MoE with --quantization int8 (attention and experts): each rank rounds its own share
    (the down projection's rows over its half of the intermediate size, so with its own scales),
    so TP=2 is not TP=1 bit for bit, but its prompt logprobs stay within a few hundredths."""
    model_dir = str(make_model_dir(tmp_path / "m", "Qwen3MoeForCausalLM", mlp_only_layers=[1]))
    one = _spawn_ranks(_rank_int8, 1, model_dir)[0]
    two = _spawn_ranks(_rank_int8, 2, model_dir)
    assert two[0] == two[1]  # the ranks agree on every token and logprob
    assert len(one[1]) == len(two[0][1]) == len(PROMPTS[0]) - 1
    for (a, _), (b, _) in zip(two[0][1], one[1], strict=True):
        assert abs(a - b) < 0.05, (a, b)
    assert any(abs(a - b) > 0 for (a, _), (b, _) in zip(two[0][1], one[1], strict=True))  # rounded apart


#: copy-heavy prompts (a piece repeated), so n-gram drafts find continuations
SPEC_PROMPTS = [[11, 12, 13, 14, 15] * 4, list(range(20, 70)), [7, 8, 9] * 6, [30, 31, 32, 33, 34, 35] * 3]


def _speculative_rank(
    rank: int, world: int, port: int, model_dir: str, spec: bool, temperature: float, queue
) -> None:
    import torch.distributed as dist

    from minisgl_core.api import ParallelContext
    from minisgl_core.config import EngineConfig
    from minisgl_core.engine.engine import Engine
    from minisgl_core.sampling import SamplingParams
    from minisgl_core.testing import drain

    join_parent_store("gloo", rank, world, port)
    try:
        drafts = dict(speculative_algorithm="ngram", speculative_num_draft_tokens=4) if spec else {}
        config = EngineConfig(
            model=model_dir, attn="torch", device="cpu", dtype="float32", tp_size=world, **drafts
        )
        engine = Engine(config, ParallelContext(rank, world, dist.group.WORLD))
        for rid, prompt in enumerate(SPEC_PROMPTS):
            # the vocabulary-parallel draw (rows 0-1), and the gathered one (top-p, logprobs)
            params = SamplingParams(temperature=temperature, max_tokens=24, ignore_eos=True, seed=rid,
                                    top_p=0.9 if rid == 3 else 1.0, logprobs=2 if rid == 2 else None)  # fmt: skip
            engine.add_request(rid, prompt, params)
        tokens: dict[int, list[int]] = {rid: [] for rid in range(len(SPEC_PROMPTS))}
        for out in drain(engine):
            tokens[out.rid].append(out.token_id)
        stats = {k: v for k, v in engine.stats().items() if k.startswith("spec_")}
        queue.put((rank, ([tokens[r] for r in range(len(SPEC_PROMPTS))], stats)))
    finally:
        engine = None
        leave_parent_store_group()


def test_tp2_with_drafts_gives_tp1_greedy_tokens_and_its_ranks_agree_when_sampling(tmp_path):
    """Speculative decoding under TP: every rank drafts from the same tokens and must accept the
    same run of them, or the ranks' KV and batches part. Greedy output with drafts at TP=2 is TP=1's
    without; sampled (temperature 0.3, seeded), both ranks emit the same tokens and the same counts
    of accepted drafts."""
    model_dir = str(
        make_model_dir(tmp_path / "m", "LlamaForCausalLM", vocab_size=1027, tie_word_embeddings=False)
    )
    plain = _spawn_ranks(_speculative_rank, 1, model_dir, False, 0.0)[0][0]
    greedy = _spawn_ranks(_speculative_rank, 2, model_dir, True, 0.0)
    assert greedy[0][0] == greedy[1][0] == plain
    assert all(len(t) == 24 for t in plain)
    assert greedy[0][1] == greedy[1][1] and greedy[0][1]["spec_accepted_tokens"] > 0, greedy[0][1]
    sampled = _spawn_ranks(_speculative_rank, 2, model_dir, True, 0.3)
    assert sampled[0] == sampled[1]
    assert sampled[0][1]["spec_verify_steps"] > 0 and sampled[0][0] != plain


def test_offline_tp_runner_reports_a_failing_rank_instead_of_hanging(tmp_path):
    """A rank that raises (here: a prompt id outside the vocabulary) ends the run with its error."""
    import time

    from minisgl_core.bench.tp import run_offline_tp
    from minisgl_core.bench.workloads import BenchRequest
    from minisgl_core.config import EngineConfig

    model_dir = make_model_dir(tmp_path / "m", "LlamaForCausalLM")
    config = EngineConfig(model=str(model_dir), attn="torch", device="cpu", dtype="float32", tp_size=2)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="prompt token ids must be integers"):
        run_offline_tp(config, [BenchRequest(prompt_ids=[10**9], max_tokens=4)] * 4)
    assert time.monotonic() - start < 120


def test_offline_tp_runner_counts_every_token_and_reports_the_page_size(tmp_path, capfd):
    from minisgl_core.bench.tp import run_offline_tp
    from minisgl_core.bench.workloads import BenchRequest
    from minisgl_core.config import EngineConfig

    model_dir = make_model_dir(tmp_path / "m", "Qwen3ForCausalLM")
    config = EngineConfig(
        model=str(model_dir), attn="torch", device="cpu", dtype="float32", tp_size=2, page_size=4
    )
    requests = [
        BenchRequest(prompt_ids=list(range(5, 5 + n)), max_tokens=m) for n, m in ((9, 3), (30, 12), (17, 1))
    ]
    result = run_offline_tp(config, requests, progress_every=0.001)
    assert result["output_tokens"] == 3 + 12 + 1 and result["requests"] == 3
    assert result["page_size"] == 4 and result["seconds"] > 0
    # rank 0 says how far the timed run is, as the one-process run does (it said nothing with --tp 2)
    out, err = capfd.readouterr()
    lines = [line for line in err.splitlines() if line.startswith("minisgl bench offline: ")]
    assert lines[0] == "minisgl bench offline: timing 3 requests (16 output tokens); a line every 0.001 s", (
        err
    )
    assert len(lines) > 1 and all(
        re.fullmatch(r"minisgl bench offline: [0-3]/3 requests done, \d+ s", x) for x in lines[1:]
    )


def test_offline_tp_runner_reports_the_speculative_counters(tmp_path):
    """bench offline --tp 2 --speculative-algorithm ngram reported no acceptance figures (--tp 1
    does): rank 0's counters come back, and greedy drafts on copy-heavy prompts are accepted."""
    from minisgl_core.bench.tp import run_offline_tp
    from minisgl_core.bench.workloads import BenchRequest
    from minisgl_core.config import EngineConfig

    model_dir = make_model_dir(tmp_path / "m", "LlamaForCausalLM")
    config = EngineConfig(model=str(model_dir), attn="torch", device="cpu", dtype="float32", tp_size=2,
                          speculative_algorithm="ngram")  # fmt: skip
    requests = [BenchRequest(prompt_ids=p, max_tokens=24) for p in SPEC_PROMPTS]
    result = run_offline_tp(config, requests, temperature=0.0)
    stats = result["speculative"]
    assert stats.verify_steps > 0 and 0 < stats.accepted_tokens <= stats.draft_tokens
    plain = run_offline_tp(dataclasses.replace(config, speculative_algorithm=None), requests, temperature=0.0)
    assert "speculative" not in plain and plain["output_tokens"] == result["output_tokens"]
    # what each ran with, as the tp_size 1 run reports it: speculation turns overlap off, and the
    # backend resolved (not the config's "auto") and the start-up times come from rank 0
    assert result["overlap"] is False and plain["overlap"] is True
    for run in (result, plain):
        assert run["attn"] == "torch,torch" and run["page_size"] >= 1  # (prefill, decode)
        assert run["init_seconds"] > 0 and run["warmup_seconds"] > 0


def test_a_rank_leaving_its_group_lets_an_unclosed_engine_and_its_group_go(tmp_path):
    """Engine start-up freezes every live object, so an engine a rank never closed (one that raised,
    say) stays in memory with its process group past destroy_process_group; gloo's threads then
    outlived the interpreter's teardown and aborted one TP test in ~20 (exit -6). Leaving through
    leave_parent_store_group collects them first."""
    import weakref

    import torch.distributed as dist

    from minisgl_core.api import ParallelContext
    from minisgl_core.config import EngineConfig
    from minisgl_core.engine.engine import Engine

    model_dir = str(make_model_dir(tmp_path / "m", "LlamaForCausalLM"))
    store = parent_store(1)
    join_parent_store("gloo", 0, 1, store.port)
    try:
        parallel = ParallelContext(0, 1, dist.group.WORLD)
        engine = Engine(EngineConfig(model=model_dir, attn="torch", device="cpu", dtype="float32"), parallel)
        held = weakref.ref(parallel), weakref.ref(engine)
        engine = parallel = None
    finally:
        leave_parent_store_group()
    assert not dist.is_initialized()
    assert held[0]() is None and held[1]() is None


def test_a_failing_rank_leaving_its_group_lets_its_engine_and_group_go(tmp_path):
    """On a rank's error path (leave_parent_store_group in a ``finally``, the exception in flight),
    the traceback held the frames that referenced the engine: it outlived destroy_process_group
    with its group, the state the helper exists to prevent (a review's find)."""
    import weakref

    import torch.distributed as dist

    from minisgl_core.api import ParallelContext
    from minisgl_core.config import EngineConfig
    from minisgl_core.engine.engine import Engine

    model_dir = str(make_model_dir(tmp_path / "m", "LlamaForCausalLM"))
    held = []

    def step(engine):
        raise ValueError("a kernel failed")

    def drive(engine):
        try:
            step(engine)
        except ValueError as exc:  # (the chained exception's frames hold the engine too)
            raise RuntimeError("a step failed") from exc

    def rank_main():
        store = parent_store(1)
        join_parent_store("gloo", 0, 1, store.port)
        engine = None
        try:
            parallel = ParallelContext(0, 1, dist.group.WORLD)
            engine = Engine(
                EngineConfig(model=model_dir, attn="torch", device="cpu", dtype="float32"), parallel
            )
            held.extend((weakref.ref(parallel), weakref.ref(engine)))
            parallel = None
            drive(engine)
        finally:
            engine = None
            leave_parent_store_group()
            held.append(not dist.is_initialized() and held[0]() is None and held[1]() is None)

    with pytest.raises(RuntimeError, match="a step failed"):
        rank_main()
    assert held[-1] is True


def test_all_reduce_takes_an_installed_fast_path_and_falls_back_when_it_declines(monkeypatch):
    """The core's fast all-reduce (symmetric memory on GPUs) is a per-group hook: used when it
    accepts the tensor, NCCL/gloo otherwise; never installed on CPU or with the symm_mem fast path off."""
    import torch
    import torch.distributed as dist

    from minisgl_core import fast_paths
    from minisgl_core.api import ParallelContext
    from minisgl_core.api.parallel import _fast_all_reduce
    from minisgl_core.distributed import enable_fast_all_reduce
    from minisgl_core.fast_paths import FastPaths

    store = parent_store(1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        # a world of one rank standing in for two: gloo's sum leaves the tensor as it is
        parallel = ParallelContext(0, 2, dist.group.WORLD)
        assert not enable_fast_all_reduce(parallel, torch.device("cpu"))
        # the switch as the model runner sets it (--disable-fast-path symm_mem or MINISGL_SYMM_MEM=0)
        monkeypatch.setattr(fast_paths, "_configured", FastPaths(symm_mem=False))
        assert not enable_fast_all_reduce(parallel, torch.device("cuda", 0))
        assert id(parallel.group) not in _fast_all_reduce
        calls = []

        def doubling(x):  # accepts even-sized tensors only
            calls.append(x.numel())
            if x.numel() % 2:
                return False
            x.mul_(2)
            return True

        _fast_all_reduce[id(parallel.group)] = doubling
        x = torch.ones(4)
        assert parallel.all_reduce(x) is x and x.tolist() == [2.0] * 4
        y = torch.ones(3)
        assert parallel.all_reduce(y).tolist() == [1.0] * 3  # declined: gloo's sum of one rank
        assert calls == [4, 3]
        assert ParallelContext().all_reduce(torch.ones(2)).tolist() == [1.0, 1.0]  # TP=1: nothing at all
        assert calls == [4, 3]
    finally:
        _fast_all_reduce.pop(id(dist.group.WORLD), None)
        dist.destroy_process_group()


def _gather_rank(rank: int, port: int, results) -> None:
    import torch
    import torch.distributed as dist

    from minisgl_core.api import ParallelContext

    join_parent_store("gloo", rank, 2, port)
    try:
        parallel = ParallelContext(rank, 2, dist.group.WORLD)
        x = torch.arange(6.0).view(2, 3) + 10 * rank  # this rank's shard
        results.put((rank, parallel.all_gather(x, dim=-1).tolist(), parallel.all_gather(x, dim=0).tolist()))
    finally:
        dist.destroy_process_group()


def test_a_stuck_group_teardown_does_not_keep_a_stopping_rank(monkeypatch, caplog):
    """On two H200s a rank whose peer's node stopped first sat in NCCL's destroy_process_group for
    ever (its node never exited): a clean stop gives the teardown LEAVE_WAIT_S, then goes on."""
    import threading

    import torch
    import torch.distributed as dist

    from minisgl_core import distributed
    from minisgl_core.api import ParallelContext

    stuck = threading.Event()
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "destroy_process_group", stuck.wait)  # never set: a teardown that hangs
    monkeypatch.setattr(distributed, "LEAVE_WAIT_S", 0.3)
    tp = distributed.TPGroup(ParallelContext(tp_rank=1, tp_size=2), None, torch.device("cpu"))
    closing = threading.Thread(target=tp.close, daemon=True)
    closing.start()
    closing.join(10)
    assert not closing.is_alive()
    assert "tensor-parallel rank 1: leaving the process group took over" in caplog.text
    stuck.set()


def test_an_infinite_peer_timeout_watches_on_and_gives_nobody_up():
    """--tp-peer-timeout inf (never give a peer up): the watch's store client took the timeout as
    its own, and a timedelta of inf seconds overflows: its thread died with a traceback."""
    import threading
    import time

    from minisgl_core.distributed import DistributedSpec, PeerWatch

    store = parent_store(1)
    lost = threading.Event()
    spec = DistributedSpec(tp_size=2, init_addr=f"127.0.0.1:{store.port}", peer_timeout_s=float("inf"))
    watch = PeerWatch(spec, 1, lambda _: lost.set())
    started = watch.answered
    # the watch beats on (a sleep of 2.5 s stood in: cut to 0.05 s, nothing had beaten yet)
    deadline = time.monotonic() + 30
    while watch.answered == started and time.monotonic() < deadline:
        time.sleep(0.05)
    watch.stop()
    assert watch.answered > started and int(store.get("minisgl/beat/1")) >= 1
    assert not lost.is_set()


@pytest.mark.parametrize(
    ("count_age", "store_age", "words"),
    [
        # rank 0 frozen: its store stopped with it, a beat after its count last moved (a lagging
        # beat on a loaded machine): the store's silence is the cause, said once it is timeout old
        (3.5, 1.5, "lost tensor-parallel rank 0 (its store has not answered for 3 s)"),
        # the store answers but rank 0's count stands still: rank 0 itself is silent
        (3.5, 0.0, "lost tensor-parallel rank 0 (silent for 3 s)"),
    ],
)
def test_a_frozen_rank_0_is_given_up_for_its_store_when_the_store_is_quiet(
    monkeypatch, count_age, store_age, words
):
    """Rank 1's judge of rank 0, from what its beat thread last heard (no threads here): a frozen
    rank 0 was given up as "silent" where its store had stopped answering too (the TP server test
    expects the store's words, and failed so under load)."""
    import threading
    import time

    from minisgl_core import distributed
    from minisgl_core.distributed import DistributedSpec, PeerWatch

    monkeypatch.setattr(distributed, "PEER_BEAT_S", 0.5)  # (a look every 0.5 s; quiet after 1 s)
    watch = object.__new__(PeerWatch)
    lost: list[str] = []
    now = time.monotonic()
    watch.spec = DistributedSpec(tp_size=2, init_addr="127.0.0.1:1", peer_timeout_s=3.0)
    watch.rank, watch.peers, watch.on_lost = 1, [0], lost.append
    watch.heard, watch.answered = {0: (7, now - count_age)}, now - store_age
    watch._stop = threading.Event()
    watch._judge()  # (returns once it gives a peer up: at most 1.5 s here)
    assert lost == [words]


def test_all_gather_concatenates_in_rank_order_along_the_dimension():
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    store = parent_store(2)
    procs = [ctx.Process(target=_gather_rank, args=(r, store.port, results)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict((r, (last, first)) for r, last, first in (results.get(timeout=120) for _ in procs))
    for p in procs:
        p.join(timeout=30)
    ranks = [[[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]], [[10.0, 11.0, 12.0], [13.0, 14.0, 15.0]]]
    along_last = [ranks[0][i] + ranks[1][i] for i in range(2)]
    assert got[0] == got[1] == (along_last, ranks[0] + ranks[1])


def _sharded_sampling_rank(rank: int, world: int, port: int, results) -> None:
    import torch
    import torch.distributed as dist

    from minisgl_core.api import ParallelContext
    from minisgl_core.runner.sampler import Sampler, SampleRequest
    from minisgl_core.sampling import SamplingParams

    join_parent_store("gloo", rank, world, port)
    try:
        parallel = ParallelContext(rank, world, dist.group.WORLD)
        torch.manual_seed(0)  # the ranks' torch RNGs agree, as the engine's --seed makes them
        sampler = Sampler(12, torch.device("cpu"))
        requests = [SampleRequest(SamplingParams(temperature=0.8), [])] * SAMPLED
        requests.append(SampleRequest(SamplingParams(temperature=0.0), []))
        drawn = []
        for logits in (MIRRORED_LOGITS, PADDED_LOGITS):
            full = torch.tensor(logits)
            width = 6  # rank r holds ids 6r .. 6r + 5 (the 11-id vocabulary padded to 12)
            start, valid = rank * width, min(width, len(logits) - rank * width)
            local = torch.full((SAMPLED + 1, width), 50.0)  # padding that would win if it were read
            local[:, :valid] = full[start : start + valid]
            local[SAMPLED, :valid] += (start + torch.arange(valid)) * 0.01  # the greedy row
            drawn.append(sampler.sample_sharded(local, requests, (start, valid), parallel).token_ids.tolist())
        results.put((rank, drawn))
    finally:
        dist.destroy_process_group()


SAMPLED = 20000
#: rank 1's ids repeat rank 0's: ranks drawing the same noise would tie on every pair, and the
#: first rank's id would always win
MIRRORED_LOGITS = [0.3, -1.0, 2.0, 0.0, 1.1, -0.4] * 2
#: 11 ids: rank 1's slice ends in a padding column
PADDED_LOGITS = [0.3, -1.0, 2.0, 0.0, 1.1, -0.4, 0.9, 1.8, -2.0, 0.5, 1.5]


def test_vocabulary_parallel_sampling_draws_from_softmax_and_every_rank_agrees():
    """Sampler.sample_sharded (TP > 1): each rank draws over its slice of the vocabulary and the
    ranks trade one (value, token) pair per row. Every rank must end with the same tokens, drawn
    from softmax(logits / T) over the whole vocabulary (so from noises independent across ranks,
    even with equal torch seeds), the last rank's padding never drawn, and a greedy row must take
    the global argmax (in rank 1's slice here)."""
    import torch

    got = _spawn_ranks(_sharded_sampling_rank, 2)
    assert got[0] == got[1]
    for logits, drawn in zip((MIRRORED_LOGITS, PADDED_LOGITS), got[0]):
        tokens = torch.tensor(drawn)
        full = torch.tensor(logits)
        assert tokens[-1].item() == int((full + 0.01 * torch.arange(len(logits))).argmax())
        freq = torch.bincount(tokens[:-1], minlength=12).float() / SAMPLED
        if len(logits) == 12:
            assert tokens[-1].item() == 8  # in rank 1's slice
        else:
            assert freq[11] == 0  # the padding column
        expected = torch.softmax(full / 0.8, dim=0)
        assert (freq[: len(logits)] - expected).abs().max() < 0.012, (freq, expected)


def _mixed_sampling_rank(rank: int, world: int, port: int, model_dir: str, queue) -> None:
    import torch.distributed as dist

    from minisgl_core.api import ParallelContext
    from minisgl_core.config import EngineConfig
    from minisgl_core.engine.engine import Engine
    from minisgl_core.sampling import SamplingParams
    from minisgl_core.testing import drain

    join_parent_store("gloo", rank, world, port)
    try:
        config = EngineConfig(model=model_dir, attn="torch", device="cpu", dtype="float32", tp_size=world)
        engine = Engine(config, ParallelContext(rank, world, dist.group.WORLD))
        sharded = engine.runner.logit_shard is not None
        plain = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True)
        nucleus = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=12, ignore_eos=True)
        with_logprobs = SamplingParams(temperature=1.0, logprobs=2, max_tokens=12, ignore_eos=True)
        for rid, params in enumerate((plain, nucleus, with_logprobs, plain)):
            engine.add_request(rid, PROMPTS[rid % len(PROMPTS)], params)
        tokens: dict[int, list[int]] = {rid: [] for rid in range(4)}
        logprobs = 0
        for out in drain(engine):
            tokens[out.rid].append(out.token_id)
            logprobs += out.logprob is not None
        queue.put((rank, (sharded, [tokens[r] for r in range(4)], logprobs)))
    finally:
        engine = None
        leave_parent_store_group()


def test_tp2_sampled_batches_agree_across_ranks_on_both_sampling_paths(tmp_path):
    """Temperature 1: plain rows take the vocabulary-parallel draw, while rows with top-p or
    logprobs need the whole vocabulary (the logits are gathered, rank 0 samples and broadcasts).
    Both ranks must emit the same tokens, and the logprobs must come out."""
    model_dir = str(
        make_model_dir(tmp_path / "m", "LlamaForCausalLM", vocab_size=1027, tie_word_embeddings=False)
    )
    got = _spawn_ranks(_mixed_sampling_rank, 2, model_dir)
    (sharded0, tokens0, logprobs0), (sharded1, tokens1, logprobs1) = got[0], got[1]
    assert sharded0 and sharded1
    assert tokens0 == tokens1
    assert all(len(t) == 12 for t in tokens0)
    assert logprobs0 == logprobs1 == 12  # the one request that asked
    assert len({t for seq in tokens0 for t in seq}) > 8  # sampled, not one token repeated


def _rank_cuda(rank: int, world: int, port: int, model_dir: str, env: dict, kwargs: dict, queue) -> None:
    """One rank of a TP engine on GPU ``rank`` (NCCL): the greedy tokens and their logprobs of
    :data:`CUDA_PROMPTS`, with ``env`` set (fast-path switches) and ``kwargs`` for EngineConfig."""
    import os

    import torch
    import torch.distributed as dist

    os.environ.update(env)
    from minisgl_core.api import ParallelContext
    from minisgl_core.config import EngineConfig
    from minisgl_core.engine.engine import Engine
    from minisgl_core.sampling import SamplingParams
    from minisgl_core.testing import drain

    torch.cuda.set_device(rank)
    join_parent_store("nccl", rank, world, port)
    try:
        parallel = ParallelContext(rank, world, dist.group.WORLD)
        engine = Engine(EngineConfig(model=model_dir, device="cuda", tp_size=world, **kwargs), parallel)
        params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, logprobs=0)
        for rid, prompt in enumerate(CUDA_PROMPTS):
            engine.add_request(rid, prompt, params)
        tokens: dict[int, list[int]] = {rid: [] for rid in range(len(CUDA_PROMPTS))}
        logprobs: dict[int, list[float]] = {rid: [] for rid in range(len(CUDA_PROMPTS))}
        for out in drain(engine):
            tokens[out.rid].append(out.token_id)
            logprobs[out.rid].append(out.logprob.logprob)
        queue.put((rank, (tokens, logprobs, engine.runner.prefill_graphs is not None)))
        engine.close()
    finally:
        engine = parallel = None
        leave_parent_store_group()


#: one prefill step of 531 tokens (within the piecewise graphs' default 8,192), then decode steps of four rows
CUDA_PROMPTS = [list(range(3, 303)), [(7 * i) % 2000 + 5 for i in range(220)], [9] * 8, [40, 41, 42]]


def _cuda_model(tmp_path, dtype: str):
    return str(
        make_model_dir(
            tmp_path / dtype,
            "LlamaForCausalLM",
            dtype=dtype,
            hidden_size=1024,
            intermediate_size=2048,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=128,
            num_hidden_layers=3,
            vocab_size=2048,
            tokenizer_vocab_size=2048,
            max_position_embeddings=2048,
        )  # fmt: skip
    )


two_gpus = pytest.mark.skipif(
    not (__import__("torch").cuda.is_available() and __import__("torch").cuda.device_count() >= 2),
    reason="needs two CUDA GPUs",
)


@two_gpus
def test_tp2_on_cuda_fused_all_reduce_norm_is_bitwise_the_unfused_path(tmp_path):
    """bf16, TP = 2 on two GPUs: the all-reduce fused with the residual add and RMS norm
    (``symm_mem_norm``, taken by the 531-token prefill step inside its piecewise graph and by the
    decode steps' graphs) gives the same tokens and the same logprobs, to the bit, as the
    all-reduce followed by the norm. (The decode steps' sums are within
    ``SymmMemAllReduce.NORM_BARRIER_MAX_ROWS``: their kernel passes the barrier itself; the
    prefill step's 531-row sums wait behind PyTorch's barrier kernel.)"""
    model_dir = _cuda_model(tmp_path, "bfloat16")
    kwargs = {"dtype": "bfloat16", "attn": "fi"}
    on = _spawn_ranks(_rank_cuda, 2, model_dir, {"MINISGL_SYMM_MEM_NORM": "1"}, kwargs)
    off = _spawn_ranks(_rank_cuda, 2, model_dir, {"MINISGL_SYMM_MEM_NORM": "0"}, kwargs)
    assert on[0][0] == on[1][0] and off[0][0] == off[1][0]  # the ranks agree
    assert on[0][0] == off[0][0]
    assert on[0][1] == off[0][1]
    assert len({t for seq in on[0][0].values() for t in seq}) > 5


@two_gpus
def test_tp2_on_cuda_piecewise_prefill_graphs_change_nothing(tmp_path):
    """float32 (no TF32), TP = 2 on two GPUs: the same greedy tokens with the piecewise prefill
    graphs (their all-reduces captured inside them) as without."""
    model_dir = _cuda_model(tmp_path, "float32")
    runs = []
    for max_tokens in (2048, 0):
        kwargs = {"dtype": "float32", "attn": "torch", "piecewise_cuda_graph_max_tokens": max_tokens}
        result = _spawn_ranks(_rank_cuda, 2, model_dir, {}, kwargs)
        assert result[0][2] == (max_tokens > 0)
        assert result[0][0] == result[1][0]
        runs.append(result[0][0])
    assert runs[0] == runs[1]


def test_rank_0_hosts_the_rendezvous_on_the_socket_it_was_handed():
    """One-node TP: the runtime holds a loopback port from start-up (loopback_listener) and rank 0's
    store takes that socket over; a port picked free and bound seconds later by rank 0 could be taken
    in between (EADDRINUSE)."""
    import threading

    from minisgl_core.distributed import DistributedSpec, _rendezvous_store, loopback_listener

    listener = loopback_listener(2)
    port = listener.getsockname()[1]
    spec = DistributedSpec(tp_size=2, init_addr=f"127.0.0.1:{port}")
    stores = {}
    joining = threading.Thread(target=lambda: stores.update(peer=_rendezvous_store(1, spec, None)))
    joining.start()
    host = _rendezvous_store(0, spec, listener)  # (waits for the peer's client)
    joining.join(30)
    host.set("said", "by rank 0")
    assert stores["peer"].get("said") == b"by rank 0"
    assert host.port == port


def test_the_peer_watch_connects_again_after_its_store_connection_broke(monkeypatch):
    """A connection to the store that broke (a network blip between nodes) while rank 0 lives on:
    the watch kept calling through the broken client and gave rank 0 up after the peer timeout."""
    import threading
    import time

    import torch.distributed as dist

    from minisgl_core import distributed
    from minisgl_core.distributed import DistributedSpec, PeerWatch

    store = parent_store(1)
    real_store = dist.TCPStore
    clients = []

    class BreaksFirst:
        """The first client's calls fail as a broken connection's do; later ones are real."""

        def __init__(self, *args, **kwargs):
            clients.append(self)
            self.real = real_store(*args, **kwargs) if len(clients) > 1 else None

        def add(self, key, amount):
            if self.real is None:
                raise RuntimeError("Broken pipe")
            return self.real.add(key, amount)

    monkeypatch.setattr(distributed.dist, "TCPStore", BreaksFirst)
    monkeypatch.setattr(distributed, "PEER_BEAT_S", 0.1)
    lost = threading.Event()
    spec = DistributedSpec(tp_size=2, init_addr=f"127.0.0.1:{store.port}", peer_timeout_s=2.0)
    watch = PeerWatch(spec, 1, lambda _: lost.set())
    started = watch.answered
    # it connects again and beats (a sleep of 1 s stood in: cut to 0.05 s, it had not yet)
    deadline = time.monotonic() + 30
    while (len(clients) < 2 or watch.answered == started) and time.monotonic() < deadline:
        time.sleep(0.05)
    watch.stop()
    assert len(clients) >= 2 and watch.answered > started
    assert int(store.get("minisgl/beat/1")) >= 1
    assert not lost.is_set()


def _allowed_bad_words_rank(rank: int, world: int, port: int, model_dir: str, queue) -> None:
    import torch.distributed as dist

    from minisgl_core.api import ParallelContext
    from minisgl_core.config import EngineConfig
    from minisgl_core.engine.engine import Engine
    from minisgl_core.sampling import SamplingParams
    from minisgl_core.testing import drain

    join_parent_store("gloo", rank, world, port)
    try:
        config = EngineConfig(model=model_dir, attn="torch", device="cpu", dtype="float32", tp_size=world)
        engine = Engine(config, ParallelContext(rank, world, dist.group.WORLD))
        first_rid = 0

        def run(*cases: SamplingParams) -> list[list[int]]:
            nonlocal first_rid
            rids = range(first_rid, first_rid + len(cases))
            first_rid += len(cases)
            for rid, params in zip(rids, cases):
                prompt = PROMPTS[rid % len(PROMPTS)]
                engine.add_request(rid, prompt, engine.admit(prompt, params))
            tokens: dict[int, list[int]] = {rid: [] for rid in rids}
            for out in drain(engine):
                tokens[out.rid].append(out.token_id)
            return [tokens[rid] for rid in rids]

        [base] = run(SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))
        word, allowed = engine.tokenizer.decode(base[3:5]), sorted({*base, 5, 6, 7})
        sampled = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True, allowed_token_ids=allowed)
        got = run(
            SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, bad_words=[word]),
            sampled,
            sampled,
        )
        queue.put((rank, (engine.runner.logit_shard is not None, base, allowed, got)))
    finally:
        engine = None
        leave_parent_store_group()


def test_tp2_allowed_token_ids_and_bad_words_agree_with_tp1_and_across_ranks(tmp_path):
    """Rows with allowed ids leave the vocabulary-parallel draw for the gathered logits (rank 0
    samples, every rank takes its tokens); each rank admits, tokenizing the bad words alike."""
    model_dir = str(
        make_model_dir(tmp_path / "m", "LlamaForCausalLM", vocab_size=1027, tie_word_embeddings=False)
    )
    (_, base, allowed, (greedy_one, *_)) = _spawn_ranks(_allowed_bad_words_rank, 1, model_dir)[0]
    two = _spawn_ranks(_allowed_bad_words_rank, 2, model_dir)
    assert two[0][0] and two[1][0]  # vocabulary-sharded sampling was on
    assert two[0][1:] == two[1][1:] and two[0][1] == base
    (greedy, *sampled) = two[0][3]
    assert greedy == greedy_one != base
    assert all(set(tokens) <= set(allowed) and len(tokens) == 12 for tokens in sampled)


def _threads_rank(rank: int, world: int, port: int, how: str, queue) -> None:
    """Reports torch's intra-op threads before and after joining a CPU group of ``world`` ranks,
    through the offline runners' store (``how`` "parent"), the server's rendezvous ("server"),
    or the parent's store with ``OMP_NUM_THREADS`` set ("omp")."""
    import os

    import torch

    from minisgl_core.distributed import DistributedSpec, init_tp_group

    if how == "omp":
        os.environ["OMP_NUM_THREADS"] = "2"
        torch.set_num_threads(2)
    before = torch.get_num_threads()
    if how == "server":
        tp = init_tp_group(
            rank, DistributedSpec(tp_size=world, init_addr=f"127.0.0.1:{port}"), torch.device("cpu")
        )
        queue.put((rank, (before, torch.get_num_threads())))
        tp.close()
        return
    join_parent_store("gloo", rank, world, port)
    try:
        queue.put((rank, (before, torch.get_num_threads())))
    finally:
        leave_parent_store_group()


@pytest.mark.parametrize("how", ["parent", "server", "omp"])
def test_cpu_ranks_share_the_cores(how):
    """Every process's torch pool defaulted to all the cores, so two CPU ranks ran twice as many
    spinning threads as cores: a --tp 2 server on two cores ran 6.3x slower than with one thread a
    rank. Each rank of a CPU group now takes its share; OMP_NUM_THREADS, where set, wins."""
    import os
    import socket

    if how == "server":
        with socket.socket() as probe:  # (a free port for rank 0's store; the server holds one)
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        procs = [ctx.Process(target=_threads_rank, args=(r, 2, port, how, queue)) for r in range(2)]
        for p in procs:
            p.start()
        results = dict(queue.get(timeout=300) for _ in procs)
        for p in procs:
            p.join(timeout=60)
    else:
        results = _spawn_ranks(_threads_rank, 2, how)
    cores = len(os.sched_getaffinity(0))
    for before, after in results.values():
        if how == "omp":
            assert after == before == 2
        else:
            assert after == max(1, min(before, cores) // 2), (before, after, cores)
