"""Constrained decoding in the engine: the selected grammar backend, each request's matcher,
and the token bitmask of a step.

The backend is built on the first constrained request (building it reads the whole vocabulary),
so a server that never sees one pays nothing. Where the masks are filled is the engine's
business (:meth:`Engine._launch`): after the forward is launched and before the sampler, so the
host fills them while the device computes the logits; with overlap, on this runner's thread while
the engine's main thread lands the step before. Each step is one batched backend call for the
tokens accepted and one for the rows filled (``GrammarBackend.accept_tokens`` / ``fill_bitmasks``).

A request with ``SamplingParams.reasoning_tag_ids`` is constrained after its reasoning
(``Request.reasoning``): its first row allows the reasoning's start tag beside the grammar's first
tokens, its rows allow every token but the end-of-text ones from that tag through the end tag, and
only the tokens after that reach its matcher.

A server's engine compiles a grammar it has not compiled before off its thread
(:meth:`GrammarRunner.start_compile`): xgrammar took 47 s on two cores for a JSON schema of 5,000
optional properties, and the scheduler must not stop for it. The request waits beside the
scheduler's queues until its compile has ended (:meth:`GrammarRunner.settled`, decided by rank 0 so
that every rank admits it in the same step) or it has waited too long.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NamedTuple

import torch

from minisgl_core.api import GrammarBackend, GrammarError, GrammarMatcher, GrammarSpec, bitmask_width
from minisgl_core.api.grammar import accepts_no_text
from minisgl_core.grammars import LazyGrammarBackend
from minisgl_core.scheduler.request import OPENING, REASONING, Request
from minisgl_core.token_bans import no_token_left, no_token_left_field, own_constraints

logger = logging.getLogger(__name__)

#: the interpreter's GIL switch interval while background fills run (seconds). With Python's
#: default 5 ms, the fill thread waits up to 5 ms for the GIL to start a fill (and again to finish
#: it) while the main thread plans the next step in Python: py-spy on the GPU machine showed the
#: main thread stalled at the hand-offs and the bitmask late; 0.2 ms measured 0.894 of the free
#: throughput against 0.839 with 5 ms (BENCHMARKS.md, constrained decoding).
GIL_SWITCH_INTERVAL_S = 0.0002

#: grammars compiled at once off the engine's thread (the libraries release the GIL and may use
#: threads of their own): a small schema is not stuck behind a few that take minutes (with two, a
#: schema of two properties waited 16.7 s behind two of 3,000 on the default model)
COMPILE_THREADS = 4
#: grammars whose text is longer than this many characters compile on threads of their own
#: (LARGE_COMPILE_THREADS): a compile cannot be stopped, and xgrammar took 17.7 s for a schema of
#: 2,000 optional properties (≈ 60,000 characters), so a client sending a few of those would
#: otherwise hold every compile thread and make each new schema behind them wait or time out
LARGE_GRAMMAR_CHARS = 16384
LARGE_COMPILE_THREADS = 2
#: compiled grammars the runner keeps (GrammarRunner._known), the least recently used dropped
#: first: at most this many, of at most KNOWN_GRAMMAR_CHARS characters of grammar text in all
#: (xgrammar's compiled grammars hold 120-200 bytes a character: under 1 GB). Every rank of a
#: server keeps and drops the same ones, as it decides by the texts alone, where all are in step.
KNOWN_GRAMMARS = 4096
KNOWN_GRAMMAR_CHARS = 1 << 22
#: the compile threads' nice value, which the threads a library starts from them inherit (xgrammar
#: starts its own per compile): where they compete with the engine's thread for a core, the engine
#: goes first. At nice 0, two compiles of 8 threads each on 2 cores held 20 free requests for 15 s.
#: At nice 10, six compiles (each 8 threads) slowed a free request of 48 tokens from 2.0 s to
#: 7.9-21.7 s on 2 cores; at 19, the lowest, to 3.8-4.0 s. A compile beside a busy engine takes
#: the longer (1,000 properties beside 8 decoding requests: 16.3 s against 3.8 s; the engine's
#: step 98 ms against 182 ms meanwhile): the request that brings the grammar waits, not the others
#: (tools/cpu_compile_load.py; BENCHMARKS.md "CPU")
COMPILE_NICE = 19


#: a constrained request whose grammar allows no next token part-way: a required property whose
#: schema is itself has no finite text (after ``{"a":`` nothing can follow), and on the default
#: model xgrammar leaves nothing after the opening quote of ``{"const": "\U00040000"}`` (which
#: json.dumps writes as a surrogate pair); llguidance's parser also stops so at its limits
DEAD_END = (
    "the grammar allows no next token after {tokens} output token(s): no text this model can write "
    "completes it (a required property whose schema is itself, for one), or the grammar backend "
    "stopped at one of its limits (llguidance: an object of several hundred properties; the "
    "server's log names it)"
)


def give_back_freed_memory() -> None:
    """Return the C heap's free memory to the system (glibc's ``malloc_trim``; elsewhere nothing).

    A grammar compile allocates far more than it keeps, on threads whose malloc arenas glibc does
    not shrink by itself: xgrammar compiling a JSON schema of 3,000 optional properties on the
    default model raised the process's resident memory from 0.4 to 1.9 GB and kept it there, for a
    compiled grammar of 17 MB (a scheduler that had compiled a few such schemas held 3.5-5.7 GB
    for good); trimmed after the compile, it fell back to 0.43 GB. Takes milliseconds."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)
    except (AttributeError, OSError):  # pragma: no cover - not glibc (musl has no malloc_trim)
        pass


def _lower_priority() -> None:
    """Run this thread (a compile thread) at COMPILE_NICE: on Linux a thread has its own nice value."""
    if sys.platform.startswith("linux"):
        try:
            tid = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, tid, max(COMPILE_NICE, os.getpriority(os.PRIO_PROCESS, tid)))
        except OSError:  # pragma: no cover - a sandbox refusing it: the compile competes as it is
            pass


class _Compiling(NamedTuple):
    """A request whose grammar compiles off the engine's thread."""

    req: Request
    future: Future[Any]
    #: when it started waiting (time.monotonic())
    since: float


class GrammarRunner:
    """Matchers of the engine's constrained requests: made at admission, advanced by each sampled
    token, asked for the next step's bitmask."""

    def __init__(
        self, backend: LazyGrammarBackend, device: torch.device, *, batched: bool = True, leader: bool = True
    ) -> None:
        self.backend = backend
        self.device = device
        #: whether this runner logs the requests it refuses (:meth:`_refuse`): rank 0's does; every
        #: other rank refuses the same requests in the same step
        self.leader = leader
        #: False: one matcher at a time through the GrammarMatcher API (the benchmark's baseline)
        self.batched = batched
        #: the thread background fills run on, started on the first
        self._thread: ThreadPoolExecutor | None = None
        #: the interpreter's switch interval before the first background fill shortened it
        self._switch_interval: float | None = None
        #: the threads grammars compile on (start_compile), by lane (large: text longer than
        #: LARGE_GRAMMAR_CHARS), each started on its first compile
        self._compile_pools: dict[bool, ThreadPoolExecutor] = {}
        #: requests waiting for their grammar's compile, by rid (in arrival order)
        self._compiling: dict[int, _Compiling] = {}
        #: the compile of each grammar still running or queued: one per grammar, however many
        #: requests wait for it
        self._compiles: dict[GrammarSpec, Future[Any]] = {}
        #: grammars some request got a matcher for (attach, finish_compile), so compiled, with
        #: their compiled form, least recently used first. Changed only there, where every rank
        #: of a server is in step, so every rank decides alike which requests compile aside (the
        #: backend's cache fills whenever a compile thread ends, and may drop one still here)
        self._known: OrderedDict[GrammarSpec, Any] = OrderedDict()
        #: characters of their texts (bounded by KNOWN_GRAMMAR_CHARS)
        self._known_chars = 0

    def attach(self, req: Request) -> None:
        """Give a constrained request its matcher; GrammarError (a ValueError) for a bad grammar."""
        spec = req.params.grammar
        if spec is None:
            return
        compiled = self._known.get(spec)
        if compiled is None:
            backend = self.backend.get()
            before = backend.compiles
            compiled = backend.compile(spec)
            if backend.compiles != before:  # compiled now, not from the cache
                give_back_freed_memory()
        self._give_matcher(req, compiled)
        self._remember(spec, compiled)

    def _remember(self, spec: GrammarSpec, compiled: Any) -> None:
        if spec in self._known:
            self._known.move_to_end(spec)
            return
        self._known[spec] = compiled
        self._known_chars += len(spec.value)
        while len(self._known) > 1 and (
            len(self._known) > KNOWN_GRAMMARS or self._known_chars > KNOWN_GRAMMAR_CHARS
        ):
            dropped, _ = self._known.popitem(last=False)
            self._known_chars -= len(dropped.value)

    def _give_matcher(self, req: Request, compiled: Any) -> None:
        try:
            req.matcher = self.backend.get().matcher(compiled)
        except GrammarError:
            raise
        except Exception as exc:  # noqa: BLE001 - the request fails, not the scheduler
            raise GrammarError(
                f"the grammar backend could not start a matcher: {type(exc).__name__}: {exc}"
            ) from exc

    # ------------------------------------------------------------------ compiles off the engine's thread

    def needs_compile(self, req: Request) -> bool:
        """Whether ``req``'s grammar is one no request has been given a matcher for yet: it
        compiles aside (or first builds the backend, which reads the whole vocabulary). The same
        answer on every rank (not the backend's cache, which fills when a compile thread ends);
        one this runner has dropped since (KNOWN_GRAMMARS, KNOWN_GRAMMAR_CHARS) compiles aside
        again, or comes from the backend's cache at once."""
        spec = req.params.grammar
        return spec is not None and spec not in self._known

    def start_compile(self, req: Request) -> None:
        """Compile ``req``'s grammar on a compile thread (one compile per grammar, shared by the
        requests waiting for it); the request waits here until :meth:`finish_compile`."""
        spec = req.params.grammar
        assert spec is not None
        future = self._compiles.get(spec)
        if future is None:
            future = self._compile_pool(len(spec.value) > LARGE_GRAMMAR_CHARS).submit(self._compile, spec)
            self._compiles[spec] = future
            future.add_done_callback(
                lambda done: self._compiles.pop(spec, None) if self._compiles.get(spec) is done else None
            )
        self._compiling[req.rid] = _Compiling(req, future, time.monotonic())

    def _compile_pool(self, large: bool) -> ThreadPoolExecutor:
        """The compile threads of a lane: large grammars queue behind each other, never in front
        of a small one."""
        pool = self._compile_pools.get(large)
        if pool is None:
            pool = self._compile_pools[large] = ThreadPoolExecutor(
                LARGE_COMPILE_THREADS if large else COMPILE_THREADS,
                thread_name_prefix="minisgl-compile-large" if large else "minisgl-compile",
                initializer=_lower_priority,
            )
        return pool

    def _compile(self, spec: GrammarSpec) -> Any:
        try:
            return self.backend.get().compile(spec)
        finally:
            give_back_freed_memory()

    @property
    def compiling(self) -> int:
        """How many requests wait for their grammar's compile."""
        return len(self._compiling)

    def settled(self, timeout: float | None) -> tuple[list[int], list[int]]:
        """(the waiting requests whose compile has ended, well or not; those waiting longer than
        ``timeout`` seconds for one still running), by rid. Rank 0 asks; every rank then acts on
        its answer (:meth:`finish_compile`, :meth:`drop_compile`), so all admit in the same step."""
        now = time.monotonic()
        done: list[int] = []
        overdue: list[int] = []
        for rid, waiting in self._compiling.items():
            if waiting.future.done():
                done.append(rid)
            elif timeout is not None and now - waiting.since > timeout:
                overdue.append(rid)
        return done, overdue

    def finish_compile(self, rid: int) -> Request | None:
        """The waiting request ``rid`` with its matcher, once this process's compile of its grammar
        has ended (it waits for it: another rank may be ahead); None when it no longer waits. A
        GrammarError (a ValueError) when its grammar did not compile."""
        waiting = self._compiling.pop(rid, None)
        if waiting is None:
            return None
        try:
            compiled = waiting.future.result()
        except GrammarError:
            raise
        except Exception as exc:  # noqa: BLE001 - the request fails, not the scheduler
            raise GrammarError(f"the grammar did not compile: {type(exc).__name__}: {exc}") from exc
        self._give_matcher(waiting.req, compiled)
        self._remember(waiting.req.params.grammar, compiled)  # type: ignore[arg-type]
        return waiting.req

    def drop_compile(self, rid: int) -> bool:
        """Stop waiting for ``rid``'s compile (aborted, or waited too long); False when it was
        not waiting. A compile no other request waits for is cancelled if it has not started; one
        running ends on its own (the libraries cannot stop one), and its grammar is then cached."""
        waiting = self._compiling.pop(rid, None)
        if waiting is None:
            return False
        if not any(w.future is waiting.future for w in self._compiling.values()):
            waiting.future.cancel()
        return True

    def close(self) -> None:
        """Stop the fill thread and give the interpreter its switch interval back (the engine's
        ``close``); a later background fill starts both again. Compiles not started are
        cancelled; one running is left to end on its own."""
        if self._thread is not None:
            self._thread.shutdown(wait=True)
            self._thread = None
        for pool in self._compile_pools.values():
            pool.shutdown(wait=False, cancel_futures=True)
        self._compile_pools.clear()
        self._compiling.clear()
        if self._switch_interval is not None:
            sys.setswitchinterval(self._switch_interval)
            self._switch_interval = None

    def accept(self, requests: Sequence[Request], token_ids: Sequence[int], live: dict[int, Request]) -> None:
        """Advance each live constrained request by its sampled token, all in one backend call
        (:meth:`GrammarBackend.accept_tokens`), and note which matchers ended
        (``Request.grammar_terminated``). A token the grammar rejects (only possible through a bug
        or a disagreeing rank) fails that request, never the engine."""
        reqs: list[Request] = []
        matchers: list[GrammarMatcher] = []
        tokens: list[int] = []
        for req, token in zip(requests, token_ids):
            matcher = req.matcher
            if matcher is None or req.grammar_error is not None or live.get(req.rid) is not req:
                continue
            if req.grammar_terminated:  # a token planned before the finish was seen: dropped later
                continue
            if req.reasoning is not None and self._in_reasoning(req, token):
                continue
            reqs.append(req)
            matchers.append(matcher)
            tokens.append(token)
        if not matchers:
            return
        backend = self.backend.get()
        try:
            if self.batched:
                accepted = backend.accept_tokens(matchers, tokens)
            else:
                accepted = GrammarBackend.accept_tokens(backend, matchers, tokens)
        except Exception as exc:  # noqa: BLE001 - a backend failure fails its requests, not the engine
            # some matchers may have moved already: none of them can be trusted again
            for req in reqs:
                self._fail(req, f"the grammar backend failed: {type(exc).__name__}: {exc}")
            return
        for req, token, ok in zip(reqs, tokens, accepted):
            if not ok:
                if self._dead_end(req.matcher):
                    # sampling had nothing to choose from: the grammar cannot go on, the request's
                    # fault (a 400), not the engine's
                    self._refuse(req, DEAD_END.format(tokens=req.grammar_tokens), "grammar")
                elif own_constraints(req.params):
                    # its allowed_token_ids or bans took out what the grammar allows: the row was
                    # empty and the sampler drew an arbitrary token (the request's fault); its
                    # output is still without the token (process() appends it after this)
                    eos = self.backend.stop_token_ids
                    why = no_token_left(req.params, req.output_ids, eos)
                    self._refuse(req, why, no_token_left_field(req.params, req.output_ids, eos))
                else:
                    self._fail(req, f"the grammar rejected sampled token {token} (not allowed here)")
                continue
            req.grammar_tokens += 1
            if req.matcher.is_terminated():
                req.grammar_terminated = True

    @staticmethod
    def _in_reasoning(req: Request, token: int) -> bool:
        """Whether ``token`` is the reasoning's, before the grammar applies (``Request.reasoning``,
        moved on here): the start tag opening the output, and everything through the end tag."""
        start, end = req.params.reasoning_tag_ids  # type: ignore[misc]
        if req.reasoning == OPENING:
            req.reasoning = REASONING if token == start else None
            return token == start
        if token == end:
            req.reasoning = None
        return True

    def _dead_end(self, matcher: GrammarMatcher) -> bool:
        """Whether ``matcher`` allows no token though it is not complete (rare: checked only when a
        sampled token was rejected)."""
        try:
            mask = torch.zeros((1, bitmask_width(self.backend.vocab_size)), dtype=torch.int32)
            matcher.fill_bitmask(mask, 0)
            return not bool(mask.any()) and not matcher.is_terminated()
        except Exception:  # noqa: BLE001 - the caller fails the request either way
            return False

    def fill(self, requests: Sequence[Request]) -> tuple[list[int], torch.Tensor] | None:
        """(rows of ``requests`` that are constrained, their bitmask on the host), or None; filled
        on this thread."""
        pending = self._start(requests, background=False)
        return None if pending is None else (pending.rows, pending.mask)

    def bitmask(self, requests: Sequence[Request], *, background: bool = False) -> PendingMask | None:
        """The bitmask of the constrained ``requests`` (None: none is): every live matcher's row
        filled in one backend call (:meth:`GrammarBackend.fill_bitmasks`, batched and
        multi-threaded where the library can); a matcher that is finished or failed allows
        everything (its token is dropped anyway), without asking the backend.

        ``background``: the fill runs on the runner's thread (the libraries release the GIL) and
        :meth:`PendingMask.result` waits for it; meanwhile the caller must leave the matchers
        alone (the scheduler reads ``Request.grammar_terminated``, not the matcher)."""
        return self._start(requests, background=background)

    def _start(self, requests: Sequence[Request], *, background: bool) -> PendingMask | None:
        rows = [i for i, r in enumerate(requests) if r.matcher is not None]
        if not rows:
            return None
        pinned = self.device.type == "cuda"
        # A fresh pinned buffer per step: the caching host allocator does not hand it out again
        # until the copy to the device has run, while a reused one could be overwritten under it.
        # Uninitialised: the backend writes every row it fills; the others are set below.
        mask = torch.empty(
            (len(rows), bitmask_width(self.backend.vocab_size)), dtype=torch.int32, pin_memory=pinned
        )
        live: list[int] = []
        #: (row, the reasoning's start tag) of requests whose output may open with it
        opening: list[tuple[int, int]] = []
        for j, i in enumerate(rows):
            req = requests[i]
            if req.grammar_error is not None or req.grammar_terminated or req.reasoning == REASONING:
                mask[j] = -1
                if req.reasoning == REASONING and not req.params.ignore_eos:
                    # the reasoning is free, but cannot end the output: the answer the grammar
                    # asks for comes after its end tag (an end-of-text drawn while thinking
                    # finished a json_schema request "stop" with no content)
                    for token in self.backend.stop_token_ids:
                        _forbid(mask, j, token)
                continue
            live.append(j)
            if req.reasoning == OPENING:
                opening.append((j, req.params.reasoning_tag_ids[0]))  # type: ignore[index]
        pending = PendingMask(rows, mask, self.device)
        if live:
            reqs = [requests[rows[j]] for j in live]
            if background:
                if self._thread is None:
                    self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="minisgl-grammar")
                    self._switch_interval = _shorten_switch_interval(log=self.leader)
                pending.future = self._thread.submit(self._fill_rows, mask, reqs, live, pending, opening)
            else:
                self._fill_rows(mask, reqs, live, pending, opening)
        return pending

    def _fill_rows(
        self,
        mask: torch.Tensor,
        reqs: list[Request],
        rows: list[int],
        pending: PendingMask,
        opening: list[tuple[int, int]],
    ) -> None:
        started = time.perf_counter()
        try:
            self._fill_rows_now(mask, reqs, rows)
            for row, token in opening:  # the grammar's first tokens, or the reasoning's start tag
                _allow(mask, row, token)
        finally:
            pending.fill_seconds = time.perf_counter() - started

    def _fill_rows_now(self, mask: torch.Tensor, reqs: list[Request], rows: list[int]) -> None:
        backend = self.backend.get()
        matchers = [r.matcher for r in reqs]
        try:
            if self.batched:
                backend.fill_bitmasks(matchers, mask, rows)  # type: ignore[arg-type]
            else:
                GrammarBackend.fill_bitmasks(backend, matchers, mask, rows)  # type: ignore[arg-type]
        except Exception:  # noqa: BLE001 - find the request at fault one row at a time (filling has no side effect)
            logger.warning(
                "batched grammar fill failed; filling %d rows one by one", len(rows), exc_info=True
            )
            for req, row in zip(reqs, rows):
                assert req.matcher is not None
                try:
                    req.matcher.fill_bitmask(mask, row)
                except Exception as exc:  # noqa: BLE001
                    self._fail(req, f"the grammar backend failed: {type(exc).__name__}: {exc}")
                    mask[row] = -1
        self._refuse_unbeginnable(mask, reqs, rows)

    def _refuse_unbeginnable(self, mask: torch.Tensor, reqs: list[Request], rows: list[int]) -> None:
        """A request whose matcher has accepted no token yet, whose grammar allows no token and is
        not complete: its grammar accepts no text (xgrammar compiles a JSON schema that only refers
        to itself so), the request's fault, so it fails as "invalid" (a 400). Admission checks
        small grammars for this already; a large one's check could take the tokenizer process
        seconds. (A grammar that runs out of tokens later is found where it rejects the token
        drawn from its empty row: :meth:`accept`, ``DEAD_END``; scanning every row each fill would
        cost more than that rare case.)"""
        words = None
        for req, row in zip(reqs, rows):
            if req.grammar_tokens or req.grammar_error is not None:
                continue
            if words is None:
                words = mask.numpy()
            if not words[row].any() and not req.matcher.is_terminated():
                spec = req.params.grammar
                self._refuse(
                    req, accepts_no_text(spec.kind if spec is not None else "json_schema"), "grammar"
                )
                mask[row] = -1

    @staticmethod
    def _fail(req: Request, why: str) -> None:
        """End ``req`` with an error (a 500): the backend failed, or it rejected a token it allowed."""
        req.grammar_error = why
        logger.error("request %d: %s", req.rid, why)

    def _refuse(self, req: Request, why: str, param: str) -> None:
        """End ``req`` as "invalid" (a 400 naming ``param``, see ``Request.error_param``): the
        request asked for what cannot be, not the server's failure, so it is logged at INFO, once
        (rank 0's runner; a storm of such requests on a TP=2 server logged an ERROR per rank)."""
        req.grammar_error = why
        req.grammar_invalid = True
        req.error_param = param
        if self.leader:
            logger.info("request %d refused: %s", req.rid, why)


def _allow(mask: torch.Tensor, row: int, token: int) -> None:
    """Set ``token``'s bit in ``mask``'s ``row`` (int32 words, token i at bit i % 32 of word i // 32)."""
    word, bit = divmod(token, 32)
    value = int(mask[row, word]) | (1 << bit)
    mask[row, word] = value - (1 << 32) if value >= 1 << 31 else value


def _forbid(mask: torch.Tensor, row: int, token: int) -> None:
    """Clear ``token``'s bit in ``mask``'s ``row`` (see :func:`_allow`)."""
    if 0 <= token < mask.shape[1] * 32:
        word, bit = divmod(token, 32)
        mask[row, word] = int(mask[row, word]) & ~(1 << bit)


def _shorten_switch_interval(*, log: bool = True) -> float | None:
    """Hand the GIL between the engine's thread and the fill thread within GIL_SWITCH_INTERVAL_S
    (process-wide, never lengthened; in a server the scheduler process runs only the engine);
    the interval it replaced, or None when it left it alone. Every rank shortens its own; only
    ``log`` (rank 0's runner) says so, once for the server."""
    before = sys.getswitchinterval()
    if GIL_SWITCH_INTERVAL_S >= before:
        return None
    if log:
        logger.info("GIL switch interval %g s for background grammar fills", GIL_SWITCH_INTERVAL_S)
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    return before


class PendingMask:
    """A step's bitmask, being filled (on the runner's thread) or filled."""

    def __init__(self, rows: list[int], mask: torch.Tensor, device: torch.device) -> None:
        #: rows of the step's sampled requests that are constrained, and their host bitmask
        self.rows, self.mask, self.device = rows, mask, device
        self.future: Future[None] | None = None
        #: how long the fill took, once done (step traces)
        self.fill_seconds: float | None = None

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows, bitmask) on the device, once filled; the copy does not wait for the device."""
        if self.future is not None:
            self.future.result()
            self.future = None
        index = torch.tensor(self.rows, dtype=torch.int64)
        if self.mask.is_pinned():
            index = index.pin_memory()
        return index.to(self.device, non_blocking=True), self.mask.to(self.device, non_blocking=True)
