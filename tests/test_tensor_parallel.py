"""Tensor parallelism on CPU (gloo): two ranks give the same greedy tokens as one."""

from __future__ import annotations

import socket

import pytest
import torch.multiprocessing as mp

from minisgl_core.demo.factories import make_model_dir

PROMPTS = [[11, 12, 13, 14, 15], list(range(20, 70)), [7] * 9]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, world: int, port: int, model_dir: str, queue) -> None:
    import torch.distributed as dist

    from minisgl_core.api import ParallelContext
    from minisgl_core.config import EngineConfig
    from minisgl_core.engine.engine import Engine
    from minisgl_core.sampling import SamplingParams
    from minisgl_core.testing import drain

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        parallel = ParallelContext(rank, world, dist.group.WORLD)
        config = EngineConfig(model=model_dir, attn="torch", device="cpu", dtype="float32", tp_size=world)
        engine = Engine(config, parallel)
        params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
        for rid, prompt in enumerate(PROMPTS):
            engine.add_request(rid, prompt, params)
        tokens: dict[int, list[int]] = {rid: [] for rid in range(len(PROMPTS))}
        for out in drain(engine):
            tokens[out.rid].append(out.token_id)
        queue.put((rank, [tokens[r] for r in range(len(PROMPTS))]))
    finally:
        dist.destroy_process_group()


def _run(world: int, model_dir: str) -> dict[int, list[list[int]]]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank, args=(r, world, port, model_dir, queue)) for r in range(world)]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=300) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return results


@pytest.mark.parametrize(
    ("arch", "overrides"),
    [
        ("Qwen3ForCausalLM", {}),  # 4 q heads / 2 kv heads: 1 kv head per rank
        ("LlamaForCausalLM", {"num_key_value_heads": 1, "tie_word_embeddings": False, "vocab_size": 1027}),
    ],
    ids=["qwen3-gqa", "llama-replicated-kv-odd-vocab"],
)
def test_tp2_equals_tp1(tmp_path, arch, overrides):
    model_dir = str(make_model_dir(tmp_path / "m", arch, **overrides))
    one = _run(1, model_dir)[0]
    two = _run(2, model_dir)
    assert two[0] == one and two[1] == one
    assert len({t for seq in one for t in seq}) > 5


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


def test_offline_tp_runner_counts_every_token_and_reports_the_page_size(tmp_path):
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
    result = run_offline_tp(config, requests)
    assert result["output_tokens"] == 3 + 12 + 1 and result["requests"] == 3
    assert result["page_size"] == 4 and result["seconds"] > 0


def test_all_reduce_takes_an_installed_fast_path_and_falls_back_when_it_declines(monkeypatch):
    """The core's fast all-reduce (symmetric memory on GPUs) is a per-group hook: used when it
    accepts the tensor, NCCL/gloo otherwise; never installed on CPU or with the symm_mem fast path off."""
    import torch
    import torch.distributed as dist

    from minisgl_core import fast_paths
    from minisgl_core.api import ParallelContext
    from minisgl_core.api.parallel import _fast_all_reduce
    from minisgl_core.distributed import enable_fast_all_reduce, free_loopback_addr
    from minisgl_core.fast_paths import FastPaths

    dist.init_process_group("gloo", init_method=f"tcp://{free_loopback_addr()}", rank=0, world_size=1)
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


def _gather_rank(rank: int, addr: str, results) -> None:
    import torch
    import torch.distributed as dist

    from minisgl_core.api import ParallelContext

    dist.init_process_group("gloo", init_method=f"tcp://{addr}", rank=rank, world_size=2)
    try:
        parallel = ParallelContext(rank, 2, dist.group.WORLD)
        x = torch.arange(6.0).view(2, 3) + 10 * rank  # this rank's shard
        results.put((rank, parallel.all_gather(x, dim=-1).tolist(), parallel.all_gather(x, dim=0).tolist()))
    finally:
        dist.destroy_process_group()


def test_all_gather_concatenates_in_rank_order_along_the_dimension():
    import torch.multiprocessing as mp

    from minisgl_core.distributed import free_loopback_addr

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    addr = free_loopback_addr()
    procs = [ctx.Process(target=_gather_rank, args=(r, addr, results)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict((r, (last, first)) for r, last, first in (results.get(timeout=120) for _ in procs))
    for p in procs:
        p.join(timeout=30)
    ranks = [[[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]], [[10.0, 11.0, 12.0], [13.0, 14.0, 15.0]]]
    along_last = [ranks[0][i] + ranks[1][i] for i in range(2)]
    assert got[0] == got[1] == (along_last, ranks[0] + ranks[1])
