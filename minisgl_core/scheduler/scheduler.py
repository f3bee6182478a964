"""The scheduler of one TP rank: queues, the policy call, batch building, and stop checks.

``schedule()`` turns the policy's plan into a :class:`ScheduledBatch` (checking every budget
itself), ``process()`` takes the sampled tokens back, decides which requests finished and
releases their KV. Every rank runs the same code on the same inputs, so they agree.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from numbers import Integral, Real

import torch

from minisgl_core.api import (
    AttentionBackend,
    Budgets,
    CacheManager,
    DecodePlan,
    ForwardBatch,
    PrefillPlan,
    SchedulerState,
    SchedulingPolicy,
)
from minisgl_core.runner.sampler import rows_to_device, to_device
from minisgl_core.sampling import StepOutput, TokenLogprob
from minisgl_core.scheduler.allocator import PageAllocator, RequestSlots
from minisgl_core.scheduler.cascade import group_shared_prefixes
from minisgl_core.scheduler.kv import KVManager
from minisgl_core.scheduler.request import Request, views
from minisgl_core.scheduler.stop import StopChecker
from minisgl_core.token_bans import drawable, no_token_left, no_token_left_field

logger = logging.getLogger(__name__)


@dataclass
class ScheduledBatch:
    forward: ForwardBatch
    requests: list[Request]
    #: chunk length per request (1 for decode)
    chunk_lens: list[int]
    #: indices into ``requests`` of the ones that get a token this step
    sampled: list[int]
    #: in a mixed step (a prefill batch carrying the running decodes), the first ``decodes``
    #: requests are decode rows of one token each; 0 in plain prefill and decode steps
    decodes: int = field(default=0, kw_only=True)
    #: the rows of ``Engine.last_tokens`` whose tokens are the first inputs of this step (its
    #: decode rows, gathered on the device when planned); None when it has none. The engine gathers
    #: them again when a sampling it launched after planning wrote newer ones (a constrained step).
    decode_rows: torch.Tensor | None = field(default=None, kw_only=True)
    #: the logits row of each request's last token when the step computes more rows than one per
    #: request (prompt logprobs); None: row i is request i's
    logit_rows: list[int] | None = field(default=None, kw_only=True)
    #: (request index, first logits row, rows, first position): the rows whose logits score the
    #: request's prompt tokens at positions + 1 (SamplingParams.prompt_logprobs)
    prompt_rows: list[tuple[int, int, int, int]] = field(default_factory=list, kw_only=True)

    def sampled_requests(self) -> list[Request]:
        """The requests that get a token this step (``requests[i]`` for ``i`` in ``sampled``): the
        batch's own list when every one does, as in a decode step (``sampled`` is then 0 .. n-1),
        not a copy of it a step."""
        if len(self.sampled) == len(self.requests):
            return self.requests
        return [self.requests[i] for i in self.sampled]

    @property
    def kind(self) -> str:
        """ "prefill", "decode" or "mixed" (step traces, diagnostics)."""
        if not self.forward.is_prefill:
            return "decode"
        return "mixed" if self.decodes else "prefill"


#: most prompt tokens a step scores for prompt_logprobs (their chunks are cut to fit): each is a
#: row of float32 logprobs over the whole vocabulary (512 x 128k: 256 MB)
PROMPT_LOGPROBS_ROWS = 512

#: rounds in a row the policy's plans may run nothing while requests wait or run before the core
#: plans the step itself; with overlap one such round is legitimate (the step in flight samples
#: the last token of every running request, and lands when nothing is planned)
STALL_ROUNDS = 3

#: a request about to be admitted whose prompt shares this many tokens past its cached prefix
#: with a prompt the step already prefills waits one round and reads them from the cache then
SHARED_IN_STEP_MIN = 32


class Scheduler:
    def __init__(
        self,
        *,
        policy: SchedulingPolicy,
        cache: CacheManager,
        num_pages: int,
        page_size: int,
        num_request_rows: int,
        max_prefill_tokens: int,
        page_table: torch.Tensor,
        last_tokens: torch.Tensor,
        prefill_attn: AttentionBackend,
        decode_attn: AttentionBackend,
        stop_checker: StopChecker,
        make_generator: Callable[[int], torch.Generator],
        cascade: bool = False,
        mixed: bool = False,
        policy_label: str | None = None,
        leader: bool = True,
    ) -> None:
        self.policy = policy
        #: whether this rank logs what every rank decides alike (rank 0; the others run the same
        #: steps in lock-step, so a TP=2 server logged each retraction and policy mistake twice)
        self.leader = leader
        #: how warnings name the policy: its selection, plugin and distribution (the engine's)
        self.policy_label = policy_label or f"scheduling policy {type(policy).__name__}"
        self.kv = KVManager(PageAllocator(num_pages, page_size), cache, page_size)
        self.rows = RequestSlots(num_request_rows)
        self.max_prefill_tokens = max_prefill_tokens
        self.page_table = page_table
        self.last_tokens = last_tokens
        self.device = page_table.device
        #: 0, 1, 2 ... on the device: a decode step's logits rows, sliced (grown for verify steps)
        self._row_indices = torch.arange(num_request_rows, device=self.device)
        self.prefill_attn = prefill_attn
        self.decode_attn = decode_attn
        self.stop_checker = stop_checker
        self.make_generator = make_generator
        #: group decode requests that share a cached prefix (the decode backend declares "cascade")
        self.cascade = cascade
        #: mixed steps: a prefill step also carries every running decode (one token each), the
        #: decodes counting against ``max_prefill_tokens`` (the prefill backend declares "mixed")
        self.mixed = mixed
        #: (MINISGL_SPLIT_MIXED) a mixed step's decode rows run on the decode backend: group them
        #: for cascade as a decode step's (``ForwardBatch.shared_prefixes`` then covers those rows)
        self.cascade_mixed = False
        #: set by the engine when speculative decoding is on: turns a decode step into a verify
        #: step with drafts, or returns None for a plain decode (see scheduler/speculative.py)
        self.speculate: Callable[[Scheduler, list[Request]], ScheduledBatch | None] | None = None
        self.waiting: dict[int, Request] = {}
        self.running: dict[int, Request] = {}
        #: of the requests waiting or running, how many have sampling that reads their newest
        #: outputs on the host (``Request.needs_host_outputs``) and how many a grammar constrains:
        #: counted as they arrive (:meth:`add`) and leave (:meth:`_gone`), since the engine asks
        #: every step and a scan of hundreds of requests found none nearly always
        self.host_output_requests = 0
        self.grammar_requests = 0
        self._arrivals = 0
        #: the kinds of policy mistakes already logged (each is logged once)
        self._warned: set[str] = set()
        #: rounds in a row whose policy plan ran nothing while there was work (see STALL_ROUNDS)
        self._stalled_rounds = 0
        #: what the cache raised this round under the policy's question (_cached_prefix_len)
        self._cache_raised: Exception | None = None
        #: set by the engine while it writes a step trace: ``timer(phase, started, seconds)`` adds
        #: ``seconds`` of host time to the step's ``phase``; :meth:`schedule` then reports its parts
        self.timer: Callable[[str, float, float], None] | None = None
        self._laps: _Laps | None = None

    # ------------------------------------------------------------------ queue

    def add(self, req: Request) -> None:
        req.arrival = self._arrivals
        self._arrivals += 1
        if req.params.seed is not None:
            req.generator = self.make_generator(req.params.seed)
        self.waiting[req.rid] = req
        self.host_output_requests += req.needs_host_outputs
        self.grammar_requests += req.params.grammar is not None

    def _gone(self, req: Request) -> None:
        """``req`` left the queues for good (finished or aborted): its KV and row are released."""
        self._release(req)
        self.host_output_requests -= req.needs_host_outputs
        self.grammar_requests -= req.params.grammar is not None

    def abort(self, rid: int) -> StepOutput | None:
        req = self.waiting.pop(rid, None) or self.running.pop(rid, None)
        if req is None:
            return None
        self._gone(req)
        return StepOutput(rid, -1, True, "abort")

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def decode_may_retract(self) -> bool:
        """Whether decoding the running requests could run out of pages and retract one. The
        engine then lands the step in flight (overlap) before it plans the next: the requests that
        step finishes free their KV first, and a retracted request keeps the token it computed.
        One comparison unless the pool is nearly exhausted."""
        obtainable = self.kv.obtainable_pages()
        return len(self.running) > obtainable and (
            self.kv.needing_a_page(list(self.running.values())) > obtainable
        )

    # ------------------------------------------------------------------ planning

    def state(self) -> SchedulerState:
        budgets = Budgets(
            prefill_tokens=self._prefill_budget(),
            free_kv_tokens=self.kv.available_pages() * self.kv.page_size,
            free_request_slots=self.rows.free,
            output_reserve_ratio=self.kv.reserve_ratio,
        )
        return SchedulerState(
            waiting=views(self.waiting.values()),
            running=views(self.running.values()),
            budgets=budgets,
            cached_prefix_len=self._cached_prefix_len,
        )

    def _cached_prefix_len(self, rid: int) -> int:
        """The policy's question to the cache. The cache raising is the cache's failure, not the
        policy's: :meth:`_schedule` raises it as it is, so the engine names the cache (it was
        first logged as the policy raising, and the core's own plan then asked the cache again)."""
        req = self.waiting[rid]  # (a rid that is not waiting: the policy's mistake)
        try:
            return self.kv.cached_prefix_len(req)
        except Exception as exc:
            self._cache_raised = exc
            raise

    def schedule(self) -> ScheduledBatch | None:
        """The next step's batch: the policy's plan, checked. A plan the core cannot use (not a
        plan at all, or an exception: the policy runs before anything changes) or that runs
        nothing while requests wait or run for :data:`STALL_ROUNDS` rounds in a row is replaced
        by the core's own (FIFO prefill, else decode everything), logged once: a policy mistake
        never stalls or fails accepted requests."""
        if not self.has_work:
            return None
        self._laps = _Laps(self.timer) if self.timer is not None else None
        try:
            return self._schedule()
        finally:
            self._laps = None

    def _lap(self, part: str) -> None:
        """End the part of :meth:`schedule` named ``part`` (for the step trace, if one is written)."""
        if self._laps is not None:
            self._laps(part)

    def _schedule(self) -> ScheduledBatch | None:
        self.kv.new_round()
        state = self.state()
        self._cache_raised = None
        try:
            plan = self.policy.schedule(state)
        except Exception as exc:  # noqa: BLE001 - nothing changed yet: the core plans this step
            if self._cache_raised is not None:  # the cache failed under the policy's question
                raise self._cache_raised from None
            self._complain(
                "raised",
                f"raised {type(exc).__name__}: {exc}; the core plans such steps itself (arrival order)",
                exc,
            )
            plan, malformed = None, "raised"
        else:
            malformed = _malformed(plan)
            if malformed is not None:
                self._complain("type", f"{malformed}; the core plans such steps itself (arrival order)")
        usable = malformed is None
        self._lap("plan")
        batch = self._carry_out(plan) if usable else None
        if batch is not None:
            self._stalled_rounds = 0
            return batch
        self._stalled_rounds += 1
        if usable and self._stalled_rounds < STALL_ROUNDS:
            return None
        queues = f"{len(self.waiting)} requests waited and {len(self.running)} ran"
        batch = self._carry_out(self._core_plan())
        if batch is not None and usable:
            self._complain(
                "stall",
                f"planned nothing that runs for {self._stalled_rounds} rounds in a row while {queues} "
                f"(its last plan: {_short(plan)}); the core plans such steps itself (arrival order)",
            )
        return batch

    def _carry_out(self, plan: PrefillPlan | DecodePlan | None) -> ScheduledBatch | None:
        if isinstance(plan, PrefillPlan):
            batch = self._build_mixed(plan) if self._mixing() else self._build_prefill(plan)
            if batch is not None:
                return batch
            plan = DecodePlan(list(self.running))  # nothing admissible: keep decoding
        if isinstance(plan, DecodePlan) and self.running:
            return self._build_decode(plan)
        return None

    def _core_plan(self) -> PrefillPlan:
        """The plan the core runs in place of an unusable one: prefill the waiting requests in
        arrival order within the token budget (admission still checks KV and rows); with none
        that fits, the caller decodes every running request."""
        tokens = self._prefill_budget()
        chunks: list[tuple[int, int]] = []
        for req in sorted(self.waiting.values(), key=lambda r: r.arrival):
            if tokens <= 0:
                break
            chunks.append((req.rid, min(req.fill_len - req.num_computed, tokens)))
            tokens -= chunks[-1][1]
        return PrefillPlan(chunks)

    def _mixing(self) -> bool:
        """Whether a prefill step now carries the running decodes: there are some, and they leave
        room for prefill tokens in the step's budget (else prefill and decode steps alternate)."""
        return self.mixed and 0 < len(self.running) < self.max_prefill_tokens

    def _prefill_budget(self) -> int:
        """New prompt tokens the next prefill step may take: ``max_prefill_tokens``, less one per
        running decode when they ride along (a mixed step's tokens stay within the budget)."""
        if self._mixing():
            return self.max_prefill_tokens - len(self.running)
        return self.max_prefill_tokens

    def _build_prefill(self, plan: PrefillPlan) -> ScheduledBatch | None:
        taken = self._take_chunks(plan, self._prefill_budget())
        self._lap("admit")
        if taken is None:
            return None
        reqs, chunks, slots = taken
        input_ids: list[int] = []
        positions: list[int] = []
        for r, n in zip(reqs, chunks):  # whole slices and ranges: no Python loop per token
            input_ids += r.fill_ids[r.num_computed : r.num_computed + n]
            positions.extend(range(r.num_computed, r.num_computed + n))
        seq_lens = [r.num_computed + n for r, n in zip(reqs, chunks)]
        sampled = [i for i, r in enumerate(reqs) if seq_lens[i] == r.fill_len]
        flat_slots = slots[0] if len(slots) == 1 else list(itertools.chain.from_iterable(slots))
        rows = _logits_rows(reqs, chunks, seq_lens)
        batch, _ = self._forward_batch(
            True, reqs, chunks, seq_lens, input_ids, positions, flat_slots, rows[0]
        )
        self._advance_prefill(reqs, seq_lens)
        self._lap("cache")
        return ScheduledBatch(batch, reqs, chunks, sampled, logit_rows=rows[1], prompt_rows=rows[2])

    def _build_mixed(self, plan: PrefillPlan) -> ScheduledBatch | None:
        """One step of every running decode (first, one token each) and the plan's prefill chunks.

        The decodes come first for the KV too: they get their next slot (retracting as a decode
        step would) before any chunk is allocated. None when no chunk can run: the caller then
        builds a plain decode step (CUDA graphs, cascade), whose slots are the ones taken here."""
        budget = self._prefill_budget()  # before a retraction shrinks ``running``
        decodes = self._decodable(list(self.running.values()))
        if decodes:
            self._retract_until_decode_fits(decodes)
        if not decodes:
            return self._build_prefill(plan)
        shared = None
        if self.cascade and self.cascade_mixed:
            decodes, shared = group_shared_prefixes(decodes, self.kv.page_size)
        dec_slots = self.kv.decode_slots(decodes)
        if dec_slots is None:  # cannot happen: the retraction left room for every one
            raise RuntimeError("KV pool exhausted with a single request running")
        taken = self._take_chunks(plan, budget)
        self._lap("admit")
        if taken is None:
            return None
        pre, chunks, slots = taken
        self.kv.decayed()
        reqs = decodes + pre
        lens = [1] * len(decodes) + chunks
        positions = [r.num_computed for r in decodes]
        prompt_ids: list[int] = []
        for r, n in zip(pre, chunks):
            positions.extend(range(r.num_computed, r.num_computed + n))
            prompt_ids += r.fill_ids[r.num_computed : r.num_computed + n]
        seq_lens = [r.num_computed + n for r, n in zip(reqs, lens)]
        flat_slots = dec_slots + list(itertools.chain.from_iterable(slots))
        sampled = list(range(len(decodes)))
        sampled += [len(decodes) + i for i, r in enumerate(pre) if r.num_computed + chunks[i] == r.fill_len]
        logit_rows = _logits_rows(reqs, lens, seq_lens)
        # a decode row's input is its last sampled token, read on the device as in a decode step
        batch, token_rows = self._forward_batch(
            True, reqs, lens, seq_lens, prompt_ids, positions, flat_slots, logit_rows[0], decodes=len(decodes)
        )
        rows = token_rows[: len(decodes)]
        batch.shared_prefixes = shared  # the decode rows' groups (rows 0 .. len(decodes) - 1)
        for req in decodes:
            req.num_computed += 1
        self._advance_prefill(pre, seq_lens[len(decodes) :])
        self._lap("cache")
        return ScheduledBatch(
            batch, reqs, lens, sampled, decodes=len(decodes), decode_rows=rows,
            logit_rows=logit_rows[1], prompt_rows=logit_rows[2],
        )  # fmt: skip

    def _advance_prefill(self, reqs: list[Request], seq_lens: list[int]) -> None:
        # State advances when the step is planned, so the next step can be planned before this
        # one's tokens reach the host (overlap scheduling).
        for req, seq_len in zip(reqs, seq_lens):
            req.num_computed = seq_len
            if seq_len == req.fill_len:
                self.running[req.rid] = self.waiting.pop(req.rid)
                self.kv.cache_prompt(req, self.page_table)

    def _shares_a_prompt_in_step(self, req: Request, taken: list[Request]) -> bool:
        """Whether ``req``, not admitted yet, shares at least :data:`SHARED_IN_STEP_MIN` tokens
        past its cached prefix with a prompt this step already prefills. Admitted a round later,
        it reads them from the cache (a prompt is offered to it as soon as it is planned whole,
        :meth:`KVManager.cache_prompt`) instead of computing them a second time: the n choices of
        one prompt, a burst of requests behind one system prompt. The window right after the
        cached prefix is compared first (cheap, and it rules out almost every other prompt), then
        everything before it (K/V at those positions are shared only behind the same tokens)."""
        if not taken or req.scores_prompt or "prefix_reuse" not in self.kv.cache.capabilities:
            return False
        start = self.kv.cached_prefix_len(req)
        end = start + SHARED_IN_STEP_MIN
        if end >= req.fill_len:  # too little left to share
            return False
        window = req.fill_ids[start:end]
        return any(  # the head is sliced only for a prompt whose window matched
            other.fill_ids[start:end] == window
            and other.cache_salt == req.cache_salt  # (the cache keeps other salts apart)
            and other.fill_ids[:start] == req.fill_ids[:start]
            for other in taken
        )

    def _take_chunks(
        self, plan: PrefillPlan, budget: int
    ) -> tuple[list[Request], list[int], list[list[int]]] | None:
        """Admit and allocate the plan's chunks within ``budget`` tokens: the requests, their
        chunk lengths and KV slots; None when not even the first one fits."""
        reqs: list[Request] = []
        chunks: list[int] = []
        slots: list[list[int]] = []
        rows_left = PROMPT_LOGPROBS_ROWS
        for rid, n in plan.chunks:
            req = self.waiting.get(rid)
            if req is None or req in reqs or budget <= 0:
                self._complain(
                    "prefill",
                    f"prefill plan names {rid!r} which is not waiting, twice, or over budget; the core ignores that chunk",
                )
                continue
            scored = req.scores_prompt
            if scored and rows_left <= 0:
                break  # (arrival order: the rest waits for the next step)
            newly_admitted = not req.admitted
            if newly_admitted and self._shares_a_prompt_in_step(req, reqs):
                continue  # admitted next round (later requests may go first: they fit)
            if newly_admitted:
                if self.rows.free == 0 or not self.kv.admit(req):
                    break  # keep arrival order: later requests do not overtake one that does not fit
                req.row = self.rows.alloc()
            n = min(max(int(n), 1), req.fill_len - req.num_computed, budget)
            if scored:
                n = min(n, rows_left)
                rows_left -= n
            req_slots = self.kv.allocate(req, req.num_computed + n)
            if req_slots is None:  # decode growth took the pages: try again after it frees some
                if newly_admitted:
                    self._release(req)
                break
            if newly_admitted and req.prefix_len:  # the reused prefix's KV, as the cache holds it
                self.page_table[req.row, : req.prefix_len] = to_device(
                    req.prefix_slots, self.device, torch.int32
                )
            if newly_admitted and not req.output_ids:  # (an admission that went ahead)
                read = min(req.prefix_len, req.prompt_len)
                if req.cached_prompt_tokens is None or read < req.cached_prompt_tokens:
                    req.cached_prompt_tokens = read
            budget -= n
            slots.append(req_slots)
            reqs.append(req)
            chunks.append(n)
        return (reqs, chunks, slots) if reqs else None

    def _build_decode(self, plan: DecodePlan) -> ScheduledBatch | None:
        running = self.running
        reqs = [running[rid] for rid in dict.fromkeys(plan.rids) if rid in running]
        if len(reqs) != len(plan.rids):
            self._complain(
                "decode",
                "decode plan names requests that are not running, or one twice; the core ignores them",
            )
        if not reqs:  # (an empty decode plan, or none of its requests running)
            if not plan.rids:
                self._complain("empty", "decode plan names no request while requests run; decoding them all")
            reqs = list(self.running.values())
        reqs = self._decodable(reqs)
        if not reqs:
            return None
        self._retract_until_decode_fits(reqs)
        if not reqs:  # the step completed meanwhile finished them all
            return None
        if self.speculate is not None and (verify := self.speculate(self, reqs)) is not None:
            return verify
        shared = None
        if self.cascade:
            reqs, shared = group_shared_prefixes(reqs, self.kv.page_size)
        slots = self.kv.decode_slots(reqs)
        if slots is None:  # cannot happen: admission keeps one request within the pool
            raise RuntimeError("KV pool exhausted with a single request running")
        self.kv.decayed()
        self._lap("admit")
        positions = [r.num_computed for r in reqs]
        seq_lens = [r.num_computed + 1 for r in reqs]
        # The last sampled token is read on the device, by each request's row: no host round trip
        # for the inputs, and no copy of the rows of their own.
        n = len(reqs)
        batch, rows = self._forward_batch(False, reqs, [1] * n, seq_lens, [], positions, slots, decodes=n)
        batch.shared_prefixes = shared
        for req in reqs:
            req.num_computed += 1
        return ScheduledBatch(batch, reqs, [1] * len(reqs), list(range(len(reqs))), decode_rows=rows)

    def _decodable(self, reqs: list[Request]) -> list[Request]:
        """``reqs`` less those whose step in flight samples their last token by length.

        With overlap such a request would be decoded once more for nothing: process() finishes it
        when that step lands. (the tokens a request will have once every planned step lands: one
        per position past its prompt)"""
        limit = self.page_table.shape[1] - 1
        return [
            r
            for r in reqs
            if r.num_computed - len(r.prompt_ids) + 1 < r.params.max_tokens and r.num_computed < limit
        ]

    def _forward_batch(
        self,
        is_prefill: bool,
        reqs: list[Request],
        chunks: list[int],
        seq_lens: list[int],
        token_ids: list[int],
        positions: list[int],
        flat_slots: list[int],
        logits_indices: list[int] | None = None,
        *,
        decodes: int = 0,
    ) -> tuple[ForwardBatch, torch.Tensor]:
        """The step's ForwardBatch, and its tokens' request rows on the device (int64, one a token).
        The first ``decodes`` tokens are decode rows' (one a request): their input is the request's
        last sampled token, read from ``last_tokens`` on the device; ``token_ids`` are the others'.

        Every small host array of the step goes to the device in one copy (each row padded to
        whole 64-byte lines: kernels receive the rows as tensors, and Triton compiles a separate
        variant for a pointer that is not 16-byte aligned, which cost a 0.6-1 s compile in the
        middle of a run at the first odd-sized prefill). The page table's new entries are written
        from an int32 copy of the slots and every index is int64, so no dtype conversion runs on
        the device (each was a kernel of its own before a step's graph)."""
        self._lap("lists")
        device = self.device
        rows = [r.row for r in reqs]
        token_rows = rows
        if is_prefill:
            token_rows = []
            for r, n in zip(rows, chunks):
                token_rows += [r] * n
        n = len(flat_slots)
        if len(token_ids) != n - decodes:
            raise ValueError(f"{len(token_ids)} token ids for {n - decodes} tokens")
        wide = [flat_slots, positions, token_rows]
        if decodes < n:  # a row of input ids, the decode rows' filled in on the device below
            wide.append([0] * decodes + token_ids if decodes else token_ids)
        blocks: list[tuple[list[list], torch.dtype]] = [
            (wide, torch.int64),
            ([rows, seq_lens, chunks], torch.int32),
            ([flat_slots], torch.int32),
        ]
        # the logits rows: more than each request's last given (prompt logprobs), else a prefill's
        # chunk ends; None: one row per sequence
        ends_host = logits_indices
        if ends_host is None and is_prefill:
            ends_host = [end - 1 for end in itertools.accumulate(chunks)]
        if ends_host is not None:
            blocks.append(([ends_host], torch.int64))
        packed, lens, slots32, *last = rows_to_device(blocks, device, lap=self._lap if self._laps else None)
        out_cache_loc, pos, token_rows_dev = packed[0, :n], packed[1, :n], packed[2, :n]
        self.page_table[token_rows_dev, pos] = slots32[0, :n]
        lens = lens[:, : len(reqs)]
        if ends_host is not None:
            ends = last[0][0, : len(ends_host)]
        else:  # 0 .. n-1, a slice of a tensor on the device already
            if len(reqs) > self._row_indices.numel():  # a verify step: 1 + drafts per request
                self._row_indices = torch.arange(2 * len(reqs), device=device)
            ends = self._row_indices[: len(reqs)]
        if decodes == n:
            input_ids = self.last_tokens[token_rows_dev]
        else:
            input_ids = packed[3, :n]
            if decodes:
                torch.index_select(self.last_tokens, 0, token_rows_dev[:decodes], out=input_ids[:decodes])
        batch = ForwardBatch(
            is_prefill=is_prefill,
            input_ids=input_ids,
            positions=pos,
            out_cache_loc=out_cache_loc,
            req_slots=lens[0],
            seq_lens=lens[1],
            extend_lens=lens[2],
            seq_lens_cpu=seq_lens,
            extend_lens_cpu=list(chunks),
            page_table=self.page_table,
            logits_indices=ends,
            attn=self.prefill_attn if is_prefill else self.decode_attn,
        )
        self._lap("index")
        return batch, token_rows_dev

    def _retract_until_decode_fits(self, reqs: list[Request]) -> None:
        """Retract the least urgent, then newest, requests (removed from ``reqs``) until every other
        one can grow by a token.

        The candidates are the running requests (one always stays) and the prompts admitted but
        only partly prefilled (they wait for their next chunk and hold pages too): admission
        expects less output of long runs as they go, so a prompt admitted late and prefilled a
        chunk a step beside a decode could hold the pool's last pages when that decode, the only
        one running, needed one. The least urgent goes first (the largest ``priority``, vLLM's
        preemption order; every request's is 0 unless the policy uses priorities), the newest of
        those. A partly prefilled prompt gives its pages
        back (what it computed to the prefix cache) and is admitted again later; a retracted
        request waits again with its output so far appended to what it must prefill. Both count
        as retractions. No step is in flight here: the engine lands it first when
        :meth:`decode_may_retract` says so (``reqs`` is a subset of the running requests)."""
        obtainable = self.kv.obtainable_pages()
        if len(reqs) <= obtainable:  # (each needs at most one page: no count of them needed)
            return
        needed = self.kv.needing_a_page(reqs)
        if needed <= obtainable:
            return
        partly = [r for r in self.waiting.values() if r.admitted]
        while needed > self.kv.obtainable_pages() and (partly or len(reqs) > 1):
            victim = max(partly + reqs if len(reqs) > 1 else partly, key=lambda r: (r.priority, r.arrival))
            self.kv.retracted()
            if victim in partly:
                partly.remove(victim)
                computed = victim.num_computed
                self._give_back_prefill(victim)
                if self.leader:
                    logger.info(
                        "KV pool full: request %d gave back its prefill (%d tokens so far)",
                        victim.rid,
                        computed,
                    )
                continue
            reqs.remove(victim)
            self._retract(victim)
            needed = self.kv.needing_a_page(reqs)
            if self.leader:  # (every rank's pool has as many pages: the ranks agree on their minimum)
                logger.info(
                    "KV pool full: retracted request %d (%d tokens so far)", victim.rid, victim.fill_len
                )

    def _give_back_prefill(self, req: Request) -> None:
        """A prompt admitted but only partly prefilled gives its pages back (what it computed to
        the prefix cache); it waits, to be admitted again."""
        self._release(req)
        req.num_computed = 0

    def _retract(self, req: Request) -> None:
        """A running request gives its pages back (what it computed to the prefix cache) and waits
        again, its output so far appended to what it must prefill."""
        del self.running[req.rid]
        self._release(req)
        req.fill_ids = req.prompt_ids + req.output_ids
        req.num_computed = 0
        self.waiting[req.rid] = req

    def retract_all(self) -> int:
        """Every request holding KV gives it back (``/pause_generation`` mode ``retract``): the
        running ones wait again (their output so far to be prefilled with the prompt), and the
        prompts partly prefilled wait to be admitted again; how many. No step may be in flight."""
        partly = [r for r in self.waiting.values() if r.admitted]
        for req in partly:
            self._give_back_prefill(req)
        running = sorted(self.running.values(), key=lambda r: r.arrival)
        for req in running:
            self._retract(req)
        return len(partly) + len(running)

    @property
    def holds_kv(self) -> bool:
        """Whether a request holds pages (one running, or a prompt partly prefilled): the prefix
        cache cannot be emptied then."""
        return bool(self.running) or any(r.admitted for r in self.waiting.values())

    def _complain(self, kind: str, what: str, exc: BaseException | None = None) -> None:
        """Log a mistake of the policy once per ``kind`` (with the traceback of the exception
        it raised, if any): it may repeat it every step. Rank 0 alone logs it: every rank runs
        the same policy on the same requests."""
        if not self.leader:
            return
        if kind not in self._warned:
            self._warned.add(kind)
            logger.warning("%s: %s", self.policy_label, what, exc_info=exc)
        else:
            logger.debug("%s: %s", self.policy_label, what)

    # ------------------------------------------------------------------ results

    def process(
        self, batch: ScheduledBatch, token_ids: list[int], logprobs: list[TokenLogprob | None]
    ) -> list[StepOutput]:
        """Append each sampled token and check stops; ``token_ids[j]`` is for ``batch.sampled[j]``.

        With overlap scheduling a request may have been planned once more after it finished (or
        been aborted) before its last token arrived here: such tokens are dropped."""
        outputs: list[StepOutput] = []
        # (read once: this loop runs for every request of every step; each StepOutput is made by
        # tuple.__new__, as its class's own __new__ makes it, without that Python-level call of
        # ten arguments: 0.11 µs a request on the dev CPU, from 0.23)
        new_tuple = tuple.__new__
        running, eos, check = self.running, self.stop_checker.eos_ids, self.stop_checker.check
        context_len = self.page_table.shape[1]
        for req, token, logprob in zip(batch.sampled_requests(), token_ids, logprobs, strict=True):
            if running.get(req.rid) is not req:
                continue
            if (
                req.has_own_constraints
                and not req.grammar_invalid
                and not drawable(req.params, req.output_ids, token, eos)
            ):
                # its allowed_token_ids and bans (and grammar) left nothing: the sampler drew an
                # arbitrary token, which must not be output (the grammar may have rejected it too)
                req.grammar_error = no_token_left(req.params, req.output_ids, eos)
                req.grammar_invalid = True
                req.error_param = no_token_left_field(req.params, req.output_ids, eos)
            req.output_ids.append(token)  # (with the KV it stands for, released below if it ends)
            if req.grammar_error is not None:
                # the token was rejected by the grammar, or drawn from a row it allowed nothing
                # in: it is not output
                token, logprob = -1, None
                reason, matched = "invalid" if req.grammar_invalid else "error", None
            else:
                reason, matched = check(req)
                if req.matcher is not None and req.grammar_terminated:
                    # the grammar is complete, also under ignore_eos; its final stop token stays hidden
                    if reason != "stop":
                        matched = token if token in eos else None
                    reason = "stop"
            if reason is None and len(req.prompt_ids) + len(req.output_ids) >= context_len:
                reason = "length"
            error = error_param = None
            if reason is not None:
                del running[req.rid]
                self._gone(req)
                if reason == "invalid":
                    error, error_param = req.grammar_error, req.error_param
                elif reason == "error":
                    error = req.grammar_error
            prompt = None
            if req.prompt_logprobs is not None and not req.prompt_logprobs_sent:
                prompt, req.prompt_logprobs_sent = req.prompt_logprobs, True
            # the first output says how much of the prompt came from the prefix cache
            cached = (req.cached_prompt_tokens or 0) if len(req.output_ids) == 1 else None
            finished = reason is not None
            # (accepted_prediction_tokens, None: a verify step's, which the Speculator sets)
            outputs.append(
                new_tuple(
                    StepOutput,
                    (req.rid, token, finished, reason, matched, logprob, error, prompt, cached, error_param,
                     None),
                )
            )  # fmt: skip
        return outputs

    def _release(self, req: Request) -> None:
        self.kv.release(req)
        if req.row is not None:
            self.rows.release(req.row)
            req.row = None


def _logits_rows(
    reqs: list[Request], chunks: list[int], seq_lens: list[int]
) -> tuple[list[int] | None, list[int] | None, list[tuple[int, int, int, int]]]:
    """For a prefill or mixed step: the token rows whose logits it computes, the logits row of
    each request's last token, and :attr:`ScheduledBatch.prompt_rows`; ``(None, None, [])`` when
    no request of the step wants prompt logprobs (each request's last row, as usual).

    A request with ``prompt_logprobs`` gets a row for every position ``p`` of its chunk before its
    prompt's last (its logits score prompt token ``p + 1``) that is not scored yet (after a
    retraction the prompt is computed again; its logprobs are not)."""
    if all(r.prompt_logprobs is None for r in reqs):
        return None, None, []
    indices: list[int] = []
    last_rows: list[int] = []
    prompt: list[tuple[int, int, int, int]] = []
    base = 0
    for i, (req, n, end) in enumerate(zip(reqs, chunks, seq_lens, strict=True)):
        start = end - n
        if req.prompt_logprobs is not None:
            lo, hi = max(start, len(req.prompt_logprobs) - 1), min(end, req.prompt_len - 1)
            if hi > lo:
                prompt.append((i, len(indices), hi - lo, lo))
                indices.extend(range(base + lo - start, base + hi - start))
        last_rows.append(len(indices))
        indices.append(base + n - 1)
        base += n
    return indices, last_rows, prompt


def _malformed(plan: object) -> str | None:
    """What makes ``plan`` no plan the core can read (None: it is one). The type, and the entries'
    types (a chunk is a request id and a token count), not whether they fit: the core checks that."""
    if plan is None:
        return None
    if isinstance(plan, PrefillPlan):
        ok = isinstance(plan.chunks, (list, tuple)) and all(
            isinstance(c, (list, tuple))
            and len(c) == 2
            and isinstance(c[0], Integral)
            and isinstance(c[1], Real)
            for c in plan.chunks
        )
        return (
            None
            if ok
            else f"returned PrefillPlan chunks that are not (request id, tokens) pairs: {_short(plan)}"
        )
    if isinstance(plan, DecodePlan):
        # every step of a decode-bound run checks a plan of up to hundreds of ids: plain ints
        # first (an isinstance against the Integral ABC is several times slower)
        ok = isinstance(plan.rids, (list, tuple)) and (
            all(type(r) is int for r in plan.rids) or all(isinstance(r, Integral) for r in plan.rids)
        )
        return None if ok else f"returned DecodePlan rids that are not request ids: {_short(plan)}"
    return f"returned {_short(plan)}, a {type(plan).__name__}: not a PrefillPlan, DecodePlan or None"


def _short(plan: object) -> str:
    """A plan as a warning shows it: its type and its first few entries."""
    text = repr(plan)
    return text if len(text) <= 80 else text[:77] + "..."


class _Laps:
    """The parts of one :meth:`Scheduler.schedule` call as phases of the step trace, each named
    ``schedule.<part>`` (they add up to at most the step's ``schedule``): ``plan`` (the queues'
    state and the policy), ``admit`` (admission, KV pages and slots), ``lists`` (the step's host
    lists), ``rows`` (each block's aligned host bytes), ``pack`` (those joined in one buffer),
    ``copy`` (the one host-to-device copy), ``index`` (the
    page table's new entries, the views and input ids on the device) and, for prefill chunks,
    ``cache`` (whole prompts offered to the prefix cache)."""

    def __init__(self, timer: Callable[[str, float, float], None]) -> None:
        self.timer = timer
        self.last = time.perf_counter()

    def __call__(self, part: str) -> None:
        now = time.perf_counter()
        self.timer(f"schedule.{part}", self.last, now - self.last)
        self.last = now
