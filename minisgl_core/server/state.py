"""The API server's link to the worker processes: submitting prompts, routing outputs back, aborting.

A route opens a :class:`RequestGroup` (one HTTP request: one or more prompts, each fanned out to
``n`` engine requests), adds its prompts (each waits for the tokenizer's admission, so a bad prompt
fails the HTTP request synchronously with a 400), reads the group's token events and closes it;
closing aborts whatever is unfinished, which is how a client that went away frees its KV.

Everything here runs on the API server's event loop; the launcher reaches it only through
``loop.call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import zmq
import zmq.asyncio

from minisgl_core.messages import AbortRequest, Admission, DetokOutputs, TokenizeRequest, decode
from minisgl_core.processes.ipc import bind_pull, connect_push, send
from minisgl_core.server.errors import APIError
from minisgl_core.server.metrics import Metrics

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelInfo:
    """What the ready handshake told us about the served model."""

    name: str
    path: str
    max_context_len: int
    kv_capacity_tokens: int
    vocab_size: int


@dataclass(frozen=True)
class TokenEvent:
    """One engine request's progress: its choice index in the group, new token and text."""

    index: int
    token_id: int
    text: str
    finish_reason: str | None
    matched_stop: str | int | None
    #: [token_text, logprob, [[top_text, top_logprob, top_id], ...], token_id] or None
    logprob: list[Any] | None
    error: str | None


@dataclass
class Delta:
    """What one choice gained since its route last looked: usually one token's event, several
    merged when the route fell behind (so a busy server sends fewer, larger chunks instead of
    falling further behind)."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[list[Any]] = field(default_factory=list)
    finish_reason: str | None = None
    matched_stop: str | int | None = None
    error: str | None = None

    def add(self, ev: TokenEvent) -> None:
        self.text += ev.text
        if ev.token_id >= 0:
            self.token_ids.append(ev.token_id)
        if ev.logprob is not None:
            self.logprobs.append(ev.logprob)
        if ev.finish_reason is not None:
            self.finish_reason, self.matched_stop, self.error = ev.finish_reason, ev.matched_stop, ev.error

    def merge(self, later: Delta) -> None:
        """Append what ``later`` (of the same choice) gained."""
        self.text += later.text
        self.token_ids += later.token_ids
        self.logprobs += later.logprobs
        if later.finish_reason is not None:
            self.finish_reason, self.matched_stop, self.error = later.finish_reason, later.matched_stop, later.error


class RequestGroup:
    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.queue: asyncio.Queue[TokenEvent] = asyncio.Queue()
        self.unfinished: dict[int, int] = {}  # rid -> choice index
        self.prompt_tokens = 0
        self.arrival = time.monotonic()
        self.num_choices = 0

    async def add(
        self,
        params: dict[str, Any],
        n: int = 1,
        *,
        text: str | None = None,
        messages: list[dict[str, str]] | None = None,
        input_ids: list[int] | None = None,
        max_tokens_field: str = "max_tokens",
    ) -> Admission:
        """Tokenize one prompt into ``n`` engine requests; raise a 400 APIError if it cannot run."""
        state = self.state
        state.check_alive()
        rids = [next(state.rids) for _ in range(n)]
        first_index = self.num_choices
        self.num_choices += n
        for i, rid in enumerate(rids):
            self.unfinished[rid] = first_index + i
            state.pending[rid] = self
        admission: asyncio.Future[Admission] = asyncio.get_running_loop().create_future()
        state.admissions[rids[0]] = admission
        send(state.to_tokenizer, TokenizeRequest(rids, text, messages, input_ids, params, max_tokens_field))
        try:
            result = await admission
        except BaseException:  # cancelled, or the server failed meanwhile
            self.close()
            raise
        finally:
            state.admissions.pop(rids[0], None)
        if result.error is not None:
            for rid in rids:
                self.unfinished.pop(rid, None)
                state.pending.pop(rid, None)
            raise APIError(400, result.error, result.param)
        self.prompt_tokens += result.prompt_len
        state.metrics.prompt_tokens += result.prompt_len
        return result

    async def deltas(self) -> AsyncIterator[Delta]:
        """Every choice's progress until all have finished: one delta per choice for all the events
        that are waiting when the route asks (an error always starts a delta of its own, so the
        text before it still goes out)."""
        open_indices = set(range(self.num_choices))
        while open_indices:
            events = [await self.queue.get()]
            while not self.queue.empty():
                events.append(self.queue.get_nowait())
            current: dict[int, Delta] = {}
            merged: list[Delta] = []
            for ev in events:
                delta = current.get(ev.index)
                if delta is None or ev.finish_reason == "error":
                    delta = current[ev.index] = Delta(ev.index)
                    merged.append(delta)
                delta.add(ev)
                if ev.finish_reason is not None:
                    open_indices.discard(ev.index)
            for delta in merged:
                yield delta

    def close(self) -> None:
        """Abort the engine requests that have not finished (the client is gone or gave up)."""
        for rid in list(self.unfinished):
            if self.state.pending.pop(rid, None) is not None:
                self.state.abort(rid)
        self.unfinished.clear()


class ServerState:
    def __init__(self, endpoints: Any, model: ModelInfo, metrics: Metrics | None = None) -> None:
        self.endpoints = endpoints
        self.model = model
        self.metrics = metrics or Metrics()
        self.rids = itertools.count()
        self.pending: dict[int, RequestGroup] = {}
        self.admissions: dict[int, asyncio.Future[Admission]] = {}
        self.last_token_at: dict[int, float] = {}
        #: set when a worker process died; every request then fails with 503
        self.failure: str | None = None
        self.created = int(time.time())
        self._task: asyncio.Task | None = None

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.sync_ctx = zmq.Context()
        # A plain socket: sends never block (no high-water mark), so sync code such as close() can send.
        self.to_tokenizer = connect_push(self.sync_ctx, self.endpoints.tokenizer)
        self.async_ctx = zmq.asyncio.Context()
        self.inbox = bind_pull(self.async_ctx, self.endpoints.api)
        self._task = asyncio.create_task(self._receive_loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        self.fail("the server is shutting down")
        self.inbox.close(linger=0)
        self.async_ctx.term()
        self.to_tokenizer.close()
        self.sync_ctx.term()

    def check_alive(self) -> None:
        if self.failure is not None:
            raise APIError(503, f"the server cannot take requests: {self.failure}", code="server_unavailable")

    def abort(self, rid: int) -> None:
        self.metrics.finished["abort"] += 1
        self.last_token_at.pop(rid, None)
        if not self.to_tokenizer.closed:  # streams cancelled at shutdown close their groups late
            send(self.to_tokenizer, AbortRequest(rid))

    def fail(self, message: str) -> None:
        """A worker died: end every waiting request with an error instead of letting it hang."""
        if self.failure is None:
            self.failure = message
        for fut in self.admissions.values():
            if not fut.done():
                fut.set_exception(APIError(503, message, code="server_unavailable"))
        for rid, group in list(self.pending.items()):
            group.queue.put_nowait(
                TokenEvent(group.unfinished.get(rid, 0), -1, "", "error", None, None, message)
            )
        self.pending.clear()

    # ------------------------------------------------------------------ outputs

    async def _receive_loop(self) -> None:
        while True:
            msg = decode(await self.inbox.recv())
            if isinstance(msg, Admission):
                fut = self.admissions.get(msg.rid)
                if fut is not None and not fut.done():
                    fut.set_result(msg)
            elif isinstance(msg, DetokOutputs):
                self._dispatch(msg)

    def _dispatch(self, out: DetokOutputs) -> None:
        if out.stats is not None:
            self.metrics.engine = out.stats
        now = time.monotonic()
        m = self.metrics
        for i, rid in enumerate(out.rids):
            group = self.pending.get(rid)
            if group is None:  # aborted or failed meanwhile
                continue
            token, reason = out.token_ids[i], out.finish_reasons[i]
            if token >= 0:
                m.generation_tokens += 1
                last = self.last_token_at.get(rid)
                if last is None:
                    m.ttft.observe(now - group.arrival)
                else:
                    m.itl.observe(now - last)
                self.last_token_at[rid] = now
            index = group.unfinished.get(rid, 0)
            if reason is not None:
                del self.pending[rid]
                group.unfinished.pop(rid, None)
                self.last_token_at.pop(rid, None)
                m.finished[reason] += 1
                m.e2e.observe(now - group.arrival)
            group.queue.put_nowait(
                TokenEvent(
                    index, token, out.texts[i], reason, out.matched_stops[i], out.logprobs[i], out.errors[i]
                )
            )
