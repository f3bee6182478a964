"""What every tensor-parallel rank does alike in lock-step (flush the prefix cache, retract a
request from a full KV pool, meet a policy's mistake, shorten the GIL switch interval) is logged
by rank 0 alone: a TP=2 server's log had each such line once per rank."""

from __future__ import annotations

import logging
import random
import sys

import pytest

from minisgl_core import SamplingParams
from minisgl_core.demo.factories import make_model_dir
from minisgl_core.engine import grammar
from minisgl_core.messages import FlushCache, StepOutputs
from minisgl_core.processes.scheduler_rank import SchedulerLoop
from minisgl_core.testing import cpu_llm


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_model_dir(
        tmp_path_factory.mktemp("m") / "qwen3", "Qwen3ForCausalLM", max_position_embeddings=512
    )


class Rank:
    def __init__(self, rank: int) -> None:
        self.size, self.rank = 2, rank


class FlushingEngine:
    def flush_cache(self) -> int:
        return 42


@pytest.mark.parametrize("rank", [0, 1])
def test_a_flush_is_logged_by_rank_zero_alone(caplog, rank):
    loop = SchedulerLoop(FlushingEngine(), Rank(rank))  # type: ignore[arg-type]
    out = StepOutputs()
    with caplog.at_level(logging.INFO, logger="minisgl_core.processes.scheduler_rank"):
        loop.apply([FlushCache(3)], out)
    assert out.flushed == [[3, 42]]  # every rank flushes; the answer is the same
    logged = "prefix cache flushed: 42 tokens freed" in caplog.text
    assert logged == (rank == 0)


@pytest.mark.parametrize("leader", [True, False], ids=["rank0", "rank1"])
def test_a_retraction_is_logged_by_the_leader_alone(caplog, model_dir, leader):
    rng = random.Random(3)
    prompts = [[rng.randrange(5, 1000) for _ in range(30)] for _ in range(6)]
    params = SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)
    # (test_engine's pool: three requests start together, outgrow it, and one is retracted)
    llm = cpu_llm(model_dir, cache="radix", num_kv_tokens=256)
    llm.engine.scheduler.leader = leader
    with caplog.at_level(logging.INFO, logger="minisgl_core.scheduler.scheduler"):
        llm.generate(prompts, params, use_tqdm=False)
    assert llm.engine.stats()["retractions"] >= 1  # every rank retracts
    assert ("KV pool full" in caplog.text) == leader
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="minisgl_core.scheduler.scheduler"):
        llm.engine.scheduler._complain("empty", "decode plan names no request")
    assert ("decode plan names no request" in caplog.text) == leader
    llm.close()


def test_the_engine_makes_rank_zero_the_leader(model_dir):
    llm = cpu_llm(model_dir, cache="naive")
    assert llm.engine.scheduler.leader and llm.engine.grammars.leader
    llm.close()


@pytest.mark.parametrize("log", [True, False])
def test_the_shortened_switch_interval_is_logged_by_the_leader_alone(caplog, monkeypatch, log):
    set_to: list[float] = []
    monkeypatch.setattr(sys, "getswitchinterval", lambda: 1.0)
    monkeypatch.setattr(sys, "setswitchinterval", set_to.append)
    with caplog.at_level(logging.INFO, logger="minisgl_core.engine.grammar"):
        assert grammar._shorten_switch_interval(log=log) == 1.0
    assert set_to == [grammar.GIL_SWITCH_INTERVAL_S]  # every rank shortens its own
    assert ("GIL switch interval" in caplog.text) == log
