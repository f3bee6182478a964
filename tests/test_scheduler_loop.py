"""Scheduler rank 0's loop (``SchedulerLoop.run_leader``) over real sockets, with an engine that
only records what the detokenizer has received when it is stepped, or a real one on a tiny model."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import zmq

from minisgl_core.demo.factories import make_model_dir
from minisgl_core.messages import (
    IDLE_MS,
    STEP_MS,
    ContinueGeneration,
    EngineRequest,
    FlushCache,
    Message,
    Shutdown,
    StepOutputs,
)
from minisgl_core.processes.ipc import bind_pull, connect_push, drain, send
from minisgl_core.processes.scheduler_rank import SchedulerLoop, StepHeartbeat
from minisgl_core.sampling import SamplingParams
from minisgl_core.testing import cpu_llm


class OneRank:
    size, rank = 1, 0


class Wires:
    """The loop's sockets over inproc (closed after the test: the ``wires`` fixture): its inbox,
    with the tokenizer's push to it, and the detokenizer's, with the loop's push to it."""

    def __init__(self) -> None:
        self.ctx = zmq.Context()
        self.inbox = bind_pull(self.ctx, "inproc://scheduler")
        self.to_scheduler = connect_push(self.ctx, "inproc://scheduler")
        self.detokenizer = bind_pull(self.ctx, "inproc://detok")
        self.to_detokenizer = connect_push(self.ctx, "inproc://detok")
        self.step_heartbeat: StepHeartbeat | None = None

    def heartbeat(self, loop: SchedulerLoop) -> None:
        """Give ``loop`` a step heartbeat that reports to the detokenizer's socket."""
        self.step_heartbeat = loop.heartbeat = StepHeartbeat(connect_push(self.ctx, "inproc://detok"), loop)

    def close(self) -> None:
        if self.step_heartbeat is not None:  # (its thread sends on a socket of the context)
            self.step_heartbeat.close()
        for sock in (self.inbox, self.detokenizer, self.to_scheduler, self.to_detokenizer):
            sock.close(linger=0)
        self.ctx.term()


@pytest.fixture
def wires() -> Iterator[Wires]:
    wires = Wires()
    yield wires
    wires.close()


class SlowEngine:
    """Always has work; each step stands for one that runs for minutes (a long prefill on a CPU):
    it notes the answers the API server could read by then, and the second step shuts down."""

    compiling = 0
    has_work = True
    idle = False
    quiet = True

    def __init__(self, to_scheduler: zmq.Socket, detokenizer: zmq.Socket) -> None:
        self.to_scheduler = to_scheduler
        self.detokenizer = detokenizer
        self.answered_before_step: list[list] = []

    def flush_cache(self) -> int | None:
        return None  # busy: requests run

    def stats(self) -> dict[str, int]:
        return {"waiting": 0}

    def step(self) -> list:
        for msg in drain(self.detokenizer):
            if isinstance(msg, StepOutputs):
                self.answered_before_step += msg.answers + msg.flushed
        send(self.to_scheduler, Shutdown())
        return []


def run(wires: Wires, msg: Message, paused: str | None) -> list[list]:
    engine = SlowEngine(wires.to_scheduler, wires.detokenizer)
    loop = SchedulerLoop(engine, OneRank())  # type: ignore[arg-type]
    loop.paused = paused
    send(wires.to_scheduler, msg)
    loop.run_leader(wires.inbox, wires.to_detokenizer)
    return engine.answered_before_step


def test_continue_generation_is_answered_before_the_step_it_starts(wires):
    """A paused server with long prompts waiting: /continue_generation's answer went out only after
    the first step it started, a prefill of minutes on a CPU (a 504 past the health bound, found by
    a probe), though the scheduler had taken it at once."""
    assert run(wires, ContinueGeneration(7), paused="in_place") == [[7, ""]]


def test_flush_cache_is_answered_before_the_next_step(wires):
    """/flush_cache on a busy server is refused at once (-1); the refusal waited for a step too."""
    assert run(wires, FlushCache(3), paused=None) == [[3, -1]]


class LongStepEngine(SlowEngine):
    """Counts the requests added as waiting; its step takes 1 s and notes the step heartbeat's
    reports meanwhile."""

    def __init__(self, to_scheduler: zmq.Socket, detokenizer: zmq.Socket) -> None:
        super().__init__(to_scheduler, detokenizer)
        self.requests = 0
        self.heartbeats: list[dict[str, int]] = []

    def add_request(self, rid: int, prompt_ids: list[int], params: SamplingParams, **kwargs) -> None:
        self.requests += 1

    def stats(self) -> dict[str, int]:
        return {"waiting": self.requests}

    def step(self) -> list:
        time.sleep(1.0)
        self.heartbeats = [m.stats for m in drain(self.detokenizer) if isinstance(m, StepOutputs) and m.stats]
        send(self.to_scheduler, Shutdown())
        return []


def test_the_step_heartbeat_says_how_long_the_step_has_run_and_counts_its_new_requests(wires):
    """While one step runs long, the heartbeat's reports carry its age (STEP_MS: /health_generate
    tells a busy engine from one stuck in a step past --step-timeout) and stats that count the
    requests the step took in: they were the last ones before it, taken while idle, so /get_load
    said 0 requests through a minute's prefill of four new prompts (found by a probe)."""
    engine = LongStepEngine(wires.to_scheduler, wires.detokenizer)
    loop = SchedulerLoop(engine, OneRank())  # type: ignore[arg-type]
    loop.last_stats = {"waiting": 0}  # (as the idle loop's last report leaves it)
    wires.heartbeat(loop)
    send(wires.to_scheduler, EngineRequest(1, [5, 6, 7], SamplingParams(max_tokens=1)))
    loop.run_leader(wires.inbox, wires.to_detokenizer)
    assert len(engine.heartbeats) >= 2, engine.heartbeats
    assert all(stats["waiting"] == 1 for stats in engine.heartbeats), engine.heartbeats
    ages = [stats.get(STEP_MS) for stats in engine.heartbeats]
    assert all(age is not None and 250 <= age <= 1100 for age in ages) and ages == sorted(ages), ages


def test_the_prompts_a_step_prefills_count_as_running_while_it_runs_not_as_waiting(tmp_path, wires):
    """/get_load's ``num_waiting_reqs`` is SGLang's ``len(waiting_queue)``: the requests no step
    has taken yet. The step heartbeat's stats, taken before the step was planned, counted the
    prompts it was prefilling as waiting through the whole step (a minute on a CPU).

    A prompt part-way through its chunks runs, not waits: it is in every step until its last chunk
    and holds its KV. SGLang takes such a request out of its waiting queue when it admits the first
    chunk (its ``chunked_req``), so it is not waiting there either; we count it among the running,
    where ``num_reqs`` (running + waiting) has always counted it.

    A real engine (tiny random model, prefill budget of 16 tokens): two 6-token prompts, a 40-token
    one and one more 6-token one arrive together; the first step prefills the first two and 4
    tokens of the long one, and the fourth waits for budget."""
    engine = cpu_llm(make_model_dir(tmp_path / "m", "LlamaForCausalLM"), max_prefill_tokens=16).engine
    loop = SchedulerLoop(engine, OneRank())  # type: ignore[arg-type]
    wires.heartbeat(loop)
    reported: list[dict[str, int]] = []  # what the heartbeat reports while each step's forward runs
    launch = engine._launch

    def launch_and_note(batch):
        reported.append(dict(loop.last_stats or {}))
        if len(reported) == 1:
            send(wires.to_scheduler, Shutdown())  # (read after this step)
        return launch(batch)

    engine._launch = launch_and_note  # type: ignore[method-assign]
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    for rid, length in enumerate([6, 6, 40, 6]):
        send(wires.to_scheduler, EngineRequest(rid, [10 * rid + 7 + i for i in range(length)], params))
    time.sleep(0.1)  # (all four in the first step's messages)
    loop.run_leader(wires.inbox, wires.to_detokenizer)
    first = reported[0]
    assert (first["running"], first["waiting"]) == (3, 1), reported
    stats = engine.stats()  # after the step: the long prompt still part-way, the fourth queued
    assert (stats["running"], stats["waiting"]) == (3, 1), stats


class FlushedEngine(SlowEngine):
    """Idle with a full prefix cache, which /flush_cache empties."""

    has_work = False
    idle = True

    def __init__(self, to_scheduler: zmq.Socket, detokenizer: zmq.Socket) -> None:
        super().__init__(to_scheduler, detokenizer)
        self.cached = 8000

    def flush_cache(self) -> int | None:
        freed, self.cached = self.cached, 0
        return freed

    def stats(self) -> dict[str, int]:
        return {"waiting": 0, "kv_used_tokens": self.cached}

    def step(self) -> list:
        return []


def test_the_idle_report_after_a_flush_gives_the_emptied_cache(wires):
    """/flush_cache on an idle server: /metrics said the cache still held its 8,000 tokens for up
    to a second (the next idle heartbeat) whenever the last report had gone less than a stats
    interval before. The step's stats, taken for the step heartbeat after the flush, were taken for
    sent, so the loop's last word before blocking did not go (found by a TP=2 storm: 1 flush in 4)."""
    import threading

    engine = FlushedEngine(wires.to_scheduler, wires.detokenizer)
    loop = SchedulerLoop(engine, OneRank())  # type: ignore[arg-type]
    wires.heartbeat(loop)
    # what the idle loop's last report (just now) left: the full cache
    loop.last_stats = loop.reported_stats = engine.stats()
    loop.last_stats_at = time.monotonic()
    thread = threading.Thread(target=loop.run_leader, args=(wires.inbox, wires.to_detokenizer))
    try:
        send(wires.to_scheduler, FlushCache(3))
        thread.start()
        reports: list[dict[str, int]] = []
        deadline = time.monotonic() + 0.5  # (the idle heartbeat comes after a second)
        while time.monotonic() < deadline and not any(r["kv_used_tokens"] == 0 for r in reports):
            if wires.detokenizer.poll(50):
                reports += [
                    m.stats for m in drain(wires.detokenizer) if isinstance(m, StepOutputs) and m.stats
                ]
        assert any(r["kv_used_tokens"] == 0 for r in reports), reports
    finally:
        send(wires.to_scheduler, Shutdown())
        thread.join(5)


def test_the_idle_heartbeat_says_how_long_every_rank_has_waited_until_work_wakes_it(wires):
    """Idle, rank 0's heartbeat (once a second) carries IDLE_MS, how long the ranks have been
    parked (/metrics' minisgl_idle_seconds: a test measures an idle server's CPU once it is there);
    the first round after a message woke it reports stats without it, even one changing no stat
    soon after the heartbeat: a request's first outputs then read as an idle server's."""
    import threading

    engine = FlushedEngine(wires.to_scheduler, wires.detokenizer)
    loop = SchedulerLoop(engine, OneRank())  # type: ignore[arg-type]
    thread = threading.Thread(target=loop.run_leader, args=(wires.inbox, wires.to_detokenizer))
    thread.start()
    try:
        deadline = time.monotonic() + 10
        idle: list[StepOutputs] = []
        while not idle:
            idle = [
                m
                for m in drain(wires.detokenizer)
                if isinstance(m, StepOutputs) and IDLE_MS in (m.stats or {})
            ]
            assert time.monotonic() < deadline, "no idle heartbeat"
            wires.detokenizer.poll(5)
        assert idle[-1].stats[IDLE_MS] >= 1000
        send(wires.to_scheduler, ContinueGeneration(7))
        reports: list[StepOutputs] = []
        deadline = time.monotonic() + 0.5  # (the next idle heartbeat comes after a second)
        while time.monotonic() < deadline and not any(r.stats for r in reports):
            if wires.detokenizer.poll(10):
                reports += [m for m in drain(wires.detokenizer) if isinstance(m, StepOutputs)]
        assert [7, ""] in [answer for r in reports for answer in r.answers], reports
        assert [IDLE_MS in r.stats for r in reports if r.stats] == [False], reports
    finally:
        send(wires.to_scheduler, Shutdown())
        thread.join(5)
