"""A scheduling policy driven by the core's real :class:`~minisgl_core.scheduler.scheduler.Scheduler`
with a fake model, every plan checked against the budgets it was given.

:class:`CheckedPolicy` wraps the policy under test and records each broken rule of the
:class:`~minisgl_core.api.SchedulingPolicy` contract (the core would silently cut such a plan back,
so the kit checks the raw plan). :class:`Simulation` feeds requests to the scheduler round by
round, "samples" a made-up token for each request that gets one, and records what came out, so a
test can check that nothing was lost, duplicated or left holding KV. The KV pool uses page_size 1,
so KV budgets are exact token counts.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from minisgl_core.api import (
    CacheManager,
    DecodePlan,
    PrefillPlan,
    RequestView,
    SchedulerState,
    SchedulingPolicy,
)
from minisgl_core.sampling import SamplingParams
from minisgl_core.scheduler.request import Request
from minisgl_core.scheduler.scheduler import Scheduler
from minisgl_core.scheduler.stop import StopChecker


def kv_need(state: SchedulerState, request: RequestView) -> int:
    """KV tokens admitting a new request takes from ``free_kv_tokens`` (its cached prefix is free)."""
    return state.budgets.kv_to_admit(request, state.cached_prefix_len(request.rid))


def plan_problems(state: SchedulerState, plan: object) -> Iterator[str]:
    """Every rule of the policy contract that ``plan`` breaks for ``state``."""
    budgets = state.budgets
    waiting = {r.rid: r for r in state.waiting}
    running = {r.rid for r in state.running}
    if plan is None:
        if running:
            yield "returned None while requests are running (a decode step could run)"
        elif any(r.num_computed > 0 for r in state.waiting) and budgets.prefill_tokens > 0:
            yield "returned None while a partly prefilled request waits"
        else:
            fits = [
                r.rid
                for r in state.waiting
                if budgets.free_request_slots > 0 and kv_need(state, r) <= budgets.free_kv_tokens
            ]
            if fits:
                yield f"returned None although request {fits[0]} fits every budget"
        return
    if isinstance(plan, DecodePlan):
        if not plan.rids:
            yield "returned an empty DecodePlan"
        if len(set(plan.rids)) != len(plan.rids):
            yield f"decode plan names a request twice: {plan.rids}"
        if not set(plan.rids) <= running:
            yield f"decode plan names {sorted(set(plan.rids) - running)}, which are not running"
        return
    if not isinstance(plan, PrefillPlan):
        yield f"returned {type(plan).__name__}; expected PrefillPlan, DecodePlan or None"
        return
    if not plan.chunks:
        yield "returned an empty PrefillPlan (return None or a DecodePlan instead)"
    tokens = new_requests = kv = 0
    seen: set[int] = set()
    for rid, n in plan.chunks:
        req = waiting.get(rid)
        if rid in seen or req is None:
            yield f"prefill plan names request {rid} " + ("twice" if rid in seen else "which is not waiting")
            continue
        seen.add(rid)
        if not isinstance(n, int) or not 1 <= n <= req.remaining_prefill:
            yield f"chunk of {n!r} tokens for request {rid}, which has {req.remaining_prefill} left to prefill"
            continue
        left = req.remaining_prefill
        if req.num_computed == 0:
            new_requests += 1
            kv += kv_need(state, req)
            left -= state.cached_prefix_len(rid)
        tokens += min(n, left)  # the core never prefills the cached prefix, whatever n says
    if tokens > budgets.prefill_tokens:
        yield f"prefills {tokens} tokens, over the prefill budget of {budgets.prefill_tokens}"
    if new_requests > budgets.free_request_slots:
        yield f"admits {new_requests} requests with {budgets.free_request_slots} free request slots"
    # continuing admitted requests takes no KV budget (it goes below 0 when the admitted ones are
    # expected to grow past the pool)
    if new_requests and kv > budgets.free_kv_tokens:
        yield f"admits requests needing {kv} KV tokens with {budgets.free_kv_tokens} free"


class CheckedPolicy(SchedulingPolicy):
    """The policy under test, with every plan checked; problems are collected, not raised, so the
    run goes on and a test can report them all."""

    def __init__(self, inner: SchedulingPolicy) -> None:
        self.inner = inner
        self.calls = 0
        self.violations: list[str] = []
        #: what the policy raised (the core plans that step itself; the simulation raises it)
        self.error: Exception | None = None

    def schedule(self, state: SchedulerState) -> PrefillPlan | DecodePlan | None:
        self.calls += 1
        try:
            plan = self.inner.schedule(state)
        except Exception as exc:
            self.error = exc
            raise
        for problem in plan_problems(state, plan):
            self.violations.append(f"call {self.calls}: {problem}")
        return plan


def fake_token(req: Request) -> int:
    """The token the fake model "samples": a function of the request and position only."""
    return 3 + (req.rid * 31 + len(req.output_ids)) % 97


@dataclass
class Simulation:
    """One scheduler over a page_size-1 KV pool of ``kv_tokens`` and ``max_requests`` request rows."""

    policy: SchedulingPolicy
    cache: CacheManager
    kv_tokens: int
    max_requests: int
    prefill_tokens: int
    max_context_len: int = 1024
    #: (API 2.0) the core's mixed steps: a prefill plan also carries every running decode
    mixed: bool = False
    round: int = 0
    arrived: dict[int, int] = field(default_factory=dict)
    #: rid -> round the core first ran a prefill chunk of it
    admitted: dict[int, int] = field(default_factory=dict)
    expected_tokens: dict[int, int] = field(default_factory=dict)
    outputs: dict[int, list[int]] = field(default_factory=dict)
    finished: dict[int, str] = field(default_factory=dict)
    aborted: set[int] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)
    #: rounds whose step was mixed (prefill chunks and running decodes together)
    mixed_steps: int = 0

    def __post_init__(self) -> None:
        self.checked = CheckedPolicy(self.policy)
        self.scheduler = Scheduler(
            policy=self.checked,
            cache=self.cache,
            num_pages=self.kv_tokens,
            page_size=1,
            num_request_rows=self.max_requests,
            max_prefill_tokens=self.prefill_tokens,
            page_table=torch.zeros(self.max_requests, self.max_context_len, dtype=torch.int32),
            last_tokens=torch.zeros(self.max_requests, dtype=torch.int64),
            prefill_attn=None,  # type: ignore[arg-type]  # the fake model never runs attention
            decode_attn=None,  # type: ignore[arg-type]
            stop_checker=StopChecker((), None),
            make_generator=lambda seed: torch.Generator().manual_seed(seed),
            mixed=self.mixed,
        )

    def add(self, rid: int, prompt: list[int], max_new_tokens: int, *, priority: int = 0) -> None:
        """Queue a request; ``priority`` (API 2.5): RequestView.priority, lower first."""
        if len(prompt) + max_new_tokens > min(self.kv_tokens, self.max_context_len):
            raise ValueError(f"request {rid} can never fit the pool; the workload is wrong")
        params = SamplingParams(max_tokens=max_new_tokens, ignore_eos=True)
        self.scheduler.add(
            Request(rid=rid, prompt_ids=list(prompt), params=params, arrival=0, priority=priority)
        )
        self.arrived[rid] = self.round
        self.expected_tokens[rid] = max_new_tokens

    def abort(self, rid: int) -> None:
        out = self.scheduler.abort(rid)
        if out is None:
            self.problems.append(f"abort of request {rid}, which was in flight, found nothing")
            return
        self.aborted.add(rid)
        self.finished[rid] = "abort"

    def step(self) -> bool:
        """One scheduling round; False when the scheduler had nothing to run."""
        self.round += 1
        batch = self.scheduler.schedule()
        if self.checked.error is not None:  # a served engine survives it; the kit fails the policy
            raise self.checked.error
        if batch is None:
            return False
        self.mixed_steps += batch.decodes > 0
        for req in batch.requests:
            self.admitted.setdefault(req.rid, self.round)
        tokens = [fake_token(batch.requests[i]) for i in batch.sampled]
        for out in self.scheduler.process(batch, tokens, [None] * len(tokens)):
            if out.rid in self.finished:
                self.problems.append(f"request {out.rid} got a token after it finished")
            self.outputs.setdefault(out.rid, []).append(out.token_id)
            if out.finished:
                self.finished[out.rid] = out.finish_reason or "?"
        return True

    def run_until_idle(self, max_rounds: int) -> None:
        for _ in range(max_rounds):
            if not self.scheduler.has_work:
                return
            if not self.step():
                waiting = [r.view() for r in self.scheduler.waiting.values()]
                self.problems.append(
                    f"stalled at round {self.round} with nothing running; waiting: {waiting}"
                )
                return
        self.problems.append(
            f"still busy after {max_rounds} rounds: {len(self.scheduler.waiting)} waiting, "
            f"{len(self.scheduler.running)} running"
        )

    def waiting_rounds(self, rid: int) -> int:
        """Rounds ``rid`` has waited (so far, if it was never admitted)."""
        return self.admitted.get(rid, self.round + 1) - self.arrived[rid]

    def report(self) -> list[str]:
        """Every problem of the run: contract violations, and anything lost, duplicated or leaked."""
        problems = self.checked.violations + self.problems
        for rid, count in self.expected_tokens.items():
            got = self.outputs.get(rid, [])
            if rid in self.aborted:
                continue
            if self.finished.get(rid) != "length":
                problems.append(f"request {rid} never finished (got {len(got)} of {count} tokens)")
            elif len(got) != count:
                problems.append(f"request {rid} finished with {len(got)} tokens, expected {count}")
        kv = self.scheduler.kv
        if not self.scheduler.has_work:
            free = kv.allocator.free_pages + kv.cache.size_info().evictable
            if free != self.kv_tokens or kv.admitted or kv.cache.size_info().protected:
                problems.append(
                    f"KV leaked: {free} of {self.kv_tokens} tokens free or evictable once idle, "
                    f"{len(kv.admitted)} requests still admitted"
                )
            if self.scheduler.rows.free != self.max_requests:
                problems.append(
                    f"request rows leaked: {self.scheduler.rows.free} of {self.max_requests} free"
                )
        return problems
