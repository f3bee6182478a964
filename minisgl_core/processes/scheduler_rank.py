"""The scheduler process of one TP rank: its engine and the loop that feeds it.

Rank 0 receives requests and aborts from the tokenizer. At the start of every step it broadcasts
that step's messages to ranks 1..N-1 (msgpack bytes in a uint8 tensor, host to host on the gloo
control group, so that no rank waits for the step in flight on its GPU), so every rank calls
``add_request`` / ``abort`` / ``step`` with the same arguments in the same order and the engines
stay in lock-step; the engine makes every rank sample the same tokens. Only rank 0 sends
outputs (and now and then ``Engine.stats()``) to the detokenizer.

When there is nothing to do, rank 0 blocks on its socket and first tells the other ranks to
park (see :meth:`TPGroup.park`): nobody spins while the server is idle. Once a second meanwhile
it wakes them and parks them again: a rank whose process or node is gone then fails that
broadcast (:class:`~minisgl_core.distributed.PeerLost`), and the server stops and says which rank it lost, instead of
answering /health until the next request finds out.

``--step-trace FILE`` (or ``MINISGL_STEP_TRACE=FILE`` in the server's environment) makes rank 0's
engine write one JSON line per step (see :mod:`minisgl_core.engine.engine`); ``new`` is then the requests that arrived just
before the step.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import msgpack
import zmq

from minisgl_core.api import GrammarError
from minisgl_core.checkpoint.formats import open_model
from minisgl_core.config import ConfigError, EngineConfig
from minisgl_core.distributed import PeerLost, PeerWatch, TPGroup, init_tp_group
from minisgl_core.engine.engine import Engine
from minisgl_core.messages import (
    HEARTBEAT_INTERVAL_MS,
    IDLE_MS,
    STEP_MS,
    AbortRequest,
    CompilesSettled,
    ContinueGeneration,
    EngineRequest,
    FlushCache,
    Message,
    PauseGeneration,
    ProcessFailed,
    Shutdown,
    StepOutputs,
    UpdateWeights,
    decode,
    encode,
)
from minisgl_core.plugins import Plugins
from minisgl_core.processes.child import ChildSpec, ReportReady, process_context
from minisgl_core.processes.ipc import bind_pull, connect_push, drain, recv, send
from minisgl_core.sampling import StepOutput, TokenLogprob
from minisgl_core.scheduler.scheduler import ScheduledBatch
from minisgl_core.setting_names import flag
from minisgl_core.tokenizer.detokenize import prompt_context

logger = logging.getLogger(__name__)

#: header value telling ranks 1..N-1 to park until rank 0 has work again
IDLE = -1
#: seconds between two stats reports while busy
STATS_INTERVAL = 0.25
#: how long a rank giving a peer up waits for its failure report to leave
GIVE_UP_LINGER_MS = 1000
#: how often an idle rank 0 looks whether a grammar compile has ended, while requests wait for one
COMPILE_POLL_MS = 5


class StepHeartbeat:
    """Says rank 0 is alive while one step runs long. The loop reports between steps (outputs,
    stats, the idle heartbeat), and a step can take minutes (a prefill of thousands of tokens on a
    CPU: 100 s for 8,000 on two cores), so /health turned 503 in the middle of a busy, healthy
    server. A thread with a socket of its own (ZeroMQ sockets are not shared between threads) sends
    the last stats four times a second while ``since`` (the step's start) is set, with how long the
    step has run (``STEP_MS``: /health_generate calls a step past --step-timeout stuck); a process
    stopped or gone still stops reporting, and so does a loop stuck outside a step."""

    def __init__(self, sock: zmq.Socket, loop: SchedulerLoop) -> None:
        self.sock = sock
        self.loop = loop
        #: when the step running now began (set by the loop), None between steps
        self.since: float | None = None
        #: False while the work in flight is a weight update's load, not a step: no STEP_MS then
        #: (--step-timeout bounds steps; loading a large checkpoint takes as long as its disk)
        self.stepping = True
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="step-heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        # four times a second: the gap /health sees is at most half a second more than the idle
        # heartbeat's, whenever in the step it began
        interval = HEARTBEAT_INTERVAL_MS / 4000
        while not self._stop.wait(interval):
            since, stats = self.since, self.loop.last_stats
            if since is not None and stats is not None and (ran := time.monotonic() - since) >= interval:
                send(
                    self.sock,
                    StepOutputs(stats={**stats, STEP_MS: int(ran * 1000)} if self.stepping else stats),
                )

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close(linger=0)


class SchedulerLoop:
    def __init__(self, engine: Engine, tp: TPGroup) -> None:
        self.engine = engine
        self.tp = tp
        self.last_stats_at = 0.0
        #: the engine's stats as last taken (what the step heartbeat reports while a step runs)
        self.last_stats: dict[str, int] | None = None
        #: the stats this loop last sent the API server: those taken for the heartbeat alone after
        #: a step's messages (a flush) did not reach /metrics, so the idle report compares to these
        self.reported_stats: dict[str, int] | None = None
        #: rank 0's reports while one step runs long (None: ranks 1..N-1, and tests)
        self.heartbeat: StepHeartbeat | None = None
        #: the first prompt token of each running request with prompt_logprobs: its wire entry
        #: (no logprob: nothing precedes it) carries the id, for the token's text
        self.first_prompt_ids: dict[int, int] = {}
        #: /update_weights_from_disk's message while it waits for the engine to go idle, and the
        #: requests that arrived meanwhile: they run on the new weights, added once those are in
        self.weight_update: UpdateWeights | None = None
        self.held: list[EngineRequest] = []
        #: /pause_generation's mode while generation is paused (the engine is not stepped: requests
        #: arriving meanwhile wait in it), None while it runs
        self.paused: str | None = None

    # ------------------------------------------------------------------ every rank

    def apply(self, msgs: list[Message], out: StepOutputs) -> bool:
        """Apply one step's messages to the engine; True when told to shut down."""
        arrived: UpdateWeights | None = None
        for msg in msgs:
            if isinstance(msg, EngineRequest):
                if self.weight_update is not None:
                    self.held.append(msg)
                else:
                    self._add(msg, out)
            elif isinstance(msg, CompilesSettled):
                for o in self.engine.admit_compiled(msg.done, msg.overdue):
                    # (its grammar did not compile, or not in time: the request's fault, a 400)
                    if self.tp.rank == 0:
                        logger.info("request %d refused by the engine: %s", o.rid, o.error)
                    self.first_prompt_ids.pop(o.rid, None)
                    out.add(o.rid, -1, o.finish_reason, error=o.error, error_param=o.error_param)
            elif isinstance(msg, AbortRequest):
                self.first_prompt_ids.pop(msg.rid, None)
                held = [m for m in self.held if m.rid != msg.rid]
                if len(held) < len(self.held):
                    self.held = held
                    out.add(msg.rid, -1, "abort")
                elif self.engine.abort(msg.rid) is not None:
                    out.add(msg.rid, -1, "abort")
            elif isinstance(msg, FlushCache):  # (every rank, the same step: their caches stay equal)
                freed = self.engine.flush_cache()
                out.flushed.append([msg.token, -1 if freed is None else freed])
                if freed is not None and self.tp.rank == 0:  # (equal caches free as many tokens)
                    logger.info("prefix cache flushed: %d tokens freed", freed)
            elif isinstance(msg, UpdateWeights):
                if self.weight_update is not None:  # (the API server sends one at a time)
                    out.answers.append([msg.token, "another weight update is in progress"])
                else:
                    self.weight_update = msg
                    arrived = msg
            elif isinstance(msg, PauseGeneration):
                self._pause(msg, out)
            elif isinstance(msg, ContinueGeneration):
                self.paused = None
                out.answers.append([msg.token, ""])
            elif isinstance(msg, Shutdown):
                return True
        if self.weight_update is not None and self.engine.quiet:
            self._update_weights(out)
        elif arrived is not None and self.tp.rank == 0:
            # (an update that seems to hang says why; a request sent after this line waits for it)
            stats = self.engine.stats()
            logger.info(
                "weight update from %s waits for the %d requests in the engine to end; requests "
                "arriving meanwhile wait for the new weights",
                arrived.model_path, stats["running"] + stats["waiting"],
            )  # fmt: skip
        return False

    @property
    def stepping(self) -> bool:
        """Whether the engine steps now: not while generation is paused."""
        return self.paused is None

    def _pause(self, msg: PauseGeneration, out: StepOutputs) -> None:
        """Land the step in flight (its tokens go out now) and step no more until
        ContinueGeneration; with mode ``retract`` the requests then give their KV back and wait to
        be computed again."""
        self._emit(self.engine.land(), out)
        if msg.mode == "retract":
            count = self.engine.retract_all()
            if count and self.tp.rank == 0:
                logger.info("generation paused: %d requests retracted", count)
        if self.paused is None or msg.mode == "retract":
            self.paused = msg.mode
        out.answers.append([msg.token, ""])

    def _add(self, msg: EngineRequest, out: StepOutputs) -> None:
        try:  # admitted by the tokenizer: the engine trusts it
            # a grammar not compiled before compiles on another thread (CompilesSettled)
            self.engine.add_request(
                msg.rid,
                msg.prompt_ids,
                msg.params,
                compile_aside=True,
                priority=msg.priority,
                cache_salt=msg.cache_salt,
                prediction_ids=msg.prediction_ids,
            )
        except ValueError as exc:  # e.g. a grammar the backend then failed to compile
            if not isinstance(exc, GrammarError):
                logger.error("request %d rejected by the engine: %s", msg.rid, exc)
                out.add(msg.rid, -1, "error", error=str(exc))
                return
            # the request's fault (a 400 naming its grammar's field), not the server's: once, at INFO
            if self.tp.rank == 0:
                logger.info("request %d refused by the engine: %s", msg.rid, exc)
            out.add(msg.rid, -1, "invalid", error=str(exc), error_param="grammar")
        else:  # the detokenizer learns how to detokenize it before its first token
            if msg.params.prompt_logprobs is not None and msg.prompt_ids:
                self.first_prompt_ids[msg.rid] = msg.prompt_ids[0]
            out.open_stream(
                msg.rid, msg.params.stop, msg.params.skip_special_tokens,
                msg.params.include_stop_str_in_output, msg.params.min_tokens,
                prompt_context(msg.prompt_ids),
            )  # fmt: skip

    def _update_weights(self, out: StepOutputs) -> None:
        """Every rank loads the new weights beside the served ones; only if all of them could do
        the served model take them (else every rank keeps the old ones, and the answer says why).
        Then the requests held meanwhile are added."""
        msg, self.weight_update = self.weight_update, None
        assert msg is not None
        staged, error = None, None
        started = time.monotonic()
        if self.heartbeat is not None:  # (/health: loading takes seconds, minutes for a big model)
            self.heartbeat.since, self.heartbeat.stepping = started, False
        try:
            staged = self.engine.stage_weights(msg.model_path)
        except PeerLost:
            raise
        except Exception as exc:  # noqa: BLE001 (the old weights serve on; the answer says why)
            error = str(exc) if isinstance(exc, (ValueError, OSError)) else f"{type(exc).__name__}: {exc}"
        finally:
            if self.heartbeat is not None:
                self.heartbeat.since, self.heartbeat.stepping = None, True
        if self.tp.size > 1:
            errors = self.tp.gather(error)
            error = next((e if r == 0 else f"rank {r}: {e}" for r, e in enumerate(errors) if e), None)
        if error is None and msg.flush_cache and self.engine.scheduler.holds_kv:
            error = (
                "the prefix cache cannot be emptied while requests paused in place hold KV "
                "computed by the old weights: pause with mode retract (or abort), or pass "
                "flush_cache false to keep their KV and the cache"
            )
        if error is None:
            freed = self.engine.adopt_weights(staged, msg.flush_cache)
            if self.tp.rank == 0:
                logger.info(
                    "weights updated from %s in %.1fs (%d cached tokens flushed)",
                    msg.model_path, time.monotonic() - started, freed,
                )  # fmt: skip
        elif self.tp.rank == 0:
            logger.error("weights not updated from %s: %s", msg.model_path, error)
        staged = None
        self.engine.release_staged()
        out.answers.append([msg.token, error or ""])
        if msg.keep_pause and error is None:
            self._pause(PauseGeneration(-1, "in_place"), out)  # (token -1: nobody awaits its answer)
        held, self.held = self.held, []
        for request in held:
            self._add(request, out)

    def step(self, out: StepOutputs) -> None:
        self._emit(self.engine.step(), out)

    def _emit(self, outputs: list[StepOutput], out: StepOutputs) -> None:
        for o in outputs:
            prompt = None
            if o.prompt_logprobs is not None:
                # the first prompt token has no logprob: its entry carries only its id
                first = self.first_prompt_ids.get(o.rid)
                head = None if first is None else [first, None, [], None]
                prompt = [head if lp is None else _wire(lp) for lp in o.prompt_logprobs]
            if o.finished or o.prompt_logprobs is not None:
                self.first_prompt_ids.pop(o.rid, None)
            if o.cached_tokens is not None:
                out.cached_tokens.append([o.rid, o.cached_tokens])
            if o.accepted_prediction_tokens:
                out.accepted_predictions.append([o.rid, o.accepted_prediction_tokens])
            out.add(
                o.rid,
                o.token_id,
                o.finish_reason if o.finished else None,
                o.matched_stop,
                _wire_logprob(o),
                o.error,
                prompt,
                o.error_param,
            )

    # ------------------------------------------------------------------ rank 0

    def run_leader(self, inbox: zmq.Socket, to_detokenizer: zmq.Socket) -> None:
        if self.heartbeat is not None:
            self.engine.on_planned = self._planned
        while True:
            msgs = drain(inbox) + self._compiles_settled()
            # (a weight update waiting for the last request to end runs now, in an empty step)
            update_now = self.weight_update is not None and self.engine.quiet
            if not msgs and not (self.stepping and self.engine.has_work) and not update_now:
                self._report_idle_stats(to_detokenizer)
                if self.tp.size > 1:
                    self.tp.broadcast_int(IDLE)
                msgs = self._wait_for_work(inbox, to_detokenizer)
                self.last_stats_at = 0.0  # (this round reports: the idle heartbeat's IDLE_MS ends)
                if self.tp.size > 1:
                    self.tp.wake()
            if self.tp.size > 1:
                payload = msgpack.packb([encode(m) for m in msgs]) if msgs else b""
                self.tp.broadcast_int(len(payload))
                if payload:
                    self.tp.broadcast_bytes(payload, len(payload))
            out = StepOutputs()
            if self.apply(msgs, out):
                send(to_detokenizer, Shutdown())
                return
            aborted = "abort" in out.finish_reasons
            if self.stepping:
                if out.flushed or out.answers:
                    # answered now, not after the step: one that prefills long prompts on a CPU
                    # takes minutes, and /continue_generation got its 504 past the health bound
                    send(to_detokenizer, out)
                    out = StepOutputs()
                if self.heartbeat is not None:
                    if msgs:  # (what the heartbeat reports counts the requests this step took in:
                        # /get_load read 0 through a minute's prefill of four new prompts; those
                        # the step prefills are counted again as running once it is planned)
                        self.last_stats = self._engine_stats()
                    self.heartbeat.since = time.monotonic()
                self.step(out)
                if self.heartbeat is not None:
                    self.heartbeat.since = None
            now = time.monotonic()
            if aborted or now - self.last_stats_at >= STATS_INTERVAL:
                out.stats = self._stats(now)
            if len(out) or out.stats is not None or out.streams or out.flushed or out.answers:
                send(to_detokenizer, out)

    def _wait_for_work(self, inbox: zmq.Socket, to_detokenizer: zmq.Socket) -> list[Message]:
        """Block until a message arrives or, while requests wait for their grammar, a compile
        ends or overruns (no busy wait); once a second meanwhile, check the parked peers and say
        it is alive (with IDLE_MS while the engine has nothing to do: the peers' wake returns once
        each has parked, as gloo sends only to a receive posted)."""
        parked = beat = time.monotonic()
        idle = self.engine.idle and not self.held
        while True:
            waiting = self.engine.compiling > 0
            msg = recv(inbox, timeout_ms=COMPILE_POLL_MS if waiting else HEARTBEAT_INTERVAL_MS)
            if msg is not None:
                return [msg, *drain(inbox), *self._compiles_settled()]
            if waiting and (settled := self._compiles_settled()):
                return settled
            now = time.monotonic()
            if now - beat >= HEARTBEAT_INTERVAL_MS / 1000:
                if self.tp.size > 1:  # the peers still there? (PeerLost if not)
                    self.tp.wake()
                    self.tp.broadcast_int(IDLE)
                stats = self._stats(now)
                if idle:
                    stats = {**stats, IDLE_MS: int((now - parked) * 1000)}
                send(to_detokenizer, StepOutputs(stats=stats))
                beat = now

    def _compiles_settled(self) -> list[Message]:
        """The step's CompilesSettled message, when a request's compile has ended or overrun."""
        if not self.engine.compiling:
            return []
        done, overdue = self.engine.compiles_settled()
        return [CompilesSettled(done, overdue)] if done or overdue else []

    def _planned(self, batch: ScheduledBatch | None) -> None:
        """Engine.on_planned (rank 0, with its step heartbeat): a prefill step takes its prompts
        out of the queue, so the stats the heartbeat reports while it runs are taken again once
        it is planned. /get_load counted the prompts a minute's prefill computed as waiting."""
        if batch is not None and batch.forward.is_prefill:
            self.last_stats = self._engine_stats()

    def _stats(self, now: float) -> dict[str, int]:
        self.last_stats_at = now
        self.last_stats = self.reported_stats = self._engine_stats()
        return self.last_stats

    def _engine_stats(self) -> dict[str, int]:
        """Engine.stats(), the requests held for a weight update counted as waiting (/get_load:
        a router sees the queue building up meanwhile)."""
        stats = self.engine.stats()
        if self.held:
            stats["waiting"] += len(self.held)
        return stats

    def _report_idle_stats(self, to_detokenizer: zmq.Socket) -> None:
        # The last word before blocking, so /metrics shows the idle state (KV freed, 0 running).
        stats = self._engine_stats()
        if stats != self.reported_stats:
            self.last_stats = self.reported_stats = stats
            self.last_stats_at = time.monotonic()
            send(to_detokenizer, StepOutputs(stats=stats))

    # ------------------------------------------------------------------ ranks 1..N-1

    def run_follower(self) -> None:
        while True:
            length = self.tp.broadcast_int()
            if length == IDLE:
                self.tp.park()
                continue
            msgs = (
                [decode(m) for m in msgpack.unpackb(self.tp.broadcast_bytes(b"", length))] if length else []
            )
            if self.apply(msgs, StepOutputs()):
                return
            if self.stepping:
                self.engine.step()


def _wire_logprob(o: StepOutput) -> list[Any] | None:
    return None if o.logprob is None else _wire(o.logprob)


def _wire(lp: TokenLogprob) -> list[Any]:
    return [lp.token_id, lp.logprob, [list(t) for t in lp.top], lp.rank]


def rank_settings(config: EngineConfig, plugins: Plugins) -> dict[str, str]:
    """What every TP rank must share, by the flag that sets it: the engine's settings (the
    ``--model`` path aside: nodes may mount it elsewhere; its config instead), and the plugins."""
    settings = {
        flag(f.name): repr(getattr(config, f.name))
        for f in dataclasses.fields(config)
        # (the trace is rank 0's alone; the KV memory share may differ: the ranks take the least pool)
        if f.name not in ("model", "step_trace", "kv_memory_fraction", "fast_paths")
    }
    off = [f.name for f in dataclasses.fields(config.fast_paths) if not getattr(config.fast_paths, f.name)]
    settings["--disable-fast-path"] = ", ".join(off) or "none"
    hf_config = open_model(config.model, plugins).hf_config()
    digest = hashlib.sha256(json.dumps(hf_config, sort_keys=True, default=str).encode()).hexdigest()[:16]
    settings["--model"] = f"a model whose config.json hashes to {digest}"
    settings["the plugins"] = f"fingerprint {plugins.fingerprint()}"
    return settings


def check_ranks_agree(tp: TPGroup, settings: dict[str, str]) -> None:
    """ConfigError naming each setting the ranks disagree on (nodes started with other flags,
    another model, other plugins or MINISGL_* switches), with every rank's value: ranks that
    differ would leave lock-step (a hang) or compute apart (wrong tokens)."""
    every = tp.gather(settings)
    differ = [name for name in every[0] if any(s.get(name) != every[0][name] for s in every[1:])]
    if differ:
        lines = "; ".join(
            f"{name}: " + ", ".join(f"{s.get(name, 'unset')} on rank {rank}" for rank, s in enumerate(every))
            for name in differ
        )
        raise ConfigError(
            f"the tensor-parallel ranks were started with different settings ({lines}); start every "
            "node with the same flags, model, plugins and MINISGL_* environment"
        )


def scheduler_main(spec: ChildSpec, plugins: Plugins, ctx: zmq.Context, report_ready: ReportReady) -> None:
    config = spec.payload["config"]
    tp = init_tp_group(spec.rank, spec.payload["dist"], config.resolve_device(), spec.payload.get("listener"))
    if tp.size > 1:
        check_ranks_agree(tp, rank_settings(config, plugins))
    # Rank 0 binds its inbox before loading the model, so early requests simply queue.
    inbox = bind_pull(ctx, spec.endpoints.scheduler) if spec.rank == 0 else None
    engine = Engine(
        config,
        tp.parallel,
        plugins,
        sampling_defaults=spec.payload["sampling_defaults"],
        context=process_context(spec, plugins),
    )
    tp.barrier()  # rank 0's ready then means every rank is ready
    report_ready(
        {
            "max_context_len": engine.max_context_len,
            "kv_capacity_tokens": engine.kv_capacity_tokens,
            "vocab_size": engine.runner.vocab_size,
            "eos_token_ids": sorted(engine.eos_ids),
            "attn": list(engine.runner.attn_names),
            "architecture": (engine.runner.hf_config.get("architectures") or ["?"])[0],
            # the API server refuses a non-zero priority unless the policy uses it
            "uses_priority": engine.uses_priority,
        }
    )
    loop = SchedulerLoop(engine, tp)
    watch = PeerWatch(spec.payload["dist"], spec.rank, _give_up_on_peer(spec)) if tp.size > 1 else None
    if inbox is not None:
        loop.heartbeat = StepHeartbeat(connect_push(ctx, spec.endpoints.detokenizer), loop)
        try:
            loop.run_leader(inbox, connect_push(ctx, spec.endpoints.detokenizer))
        finally:
            loop.heartbeat.close()
    else:
        loop.run_follower()
    if watch is not None:
        watch.stop()
    tp.close()


def _give_up_on_peer(spec: ChildSpec) -> Callable[[str], None]:
    """What a rank does when its :class:`PeerWatch` gives a peer up: its main thread may wait in a
    collective for ever, so from the watch's thread it reports the failure to its launcher, as a
    ``PeerLost`` raised in the loop would be, and exits."""

    def give_up(summary: str) -> None:
        logger.error("%s; stopping", summary)
        own = zmq.Context()  # (destroying it waits until the report has left; the shared one's
        # other sockets belong to a thread that may never return)
        send(connect_push(own, spec.endpoints.control), ProcessFailed(
            spec.role, spec.rank, f"PeerLost: {summary}", f"PeerLost: {summary}"
        ))  # fmt: skip
        own.destroy(linger=GIVE_UP_LINGER_MS)
        logging.shutdown()
        os._exit(1)

    return give_up
