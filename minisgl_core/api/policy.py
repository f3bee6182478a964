"""Scheduling policies: which requests run in the next step.

The core computes the budgets, calls the policy, and checks its plan: a plan that breaks a
budget is cut back to fit (and logged), never trusted.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import ClassVar, NamedTuple


class RequestView(NamedTuple):
    rid: int
    #: arrival order (smaller = earlier)
    arrival: int
    prompt_len: int
    #: prompt tokens whose KV already exists (prefix-cache hit + chunks prefilled so far)
    num_computed: int
    #: tokens generated so far
    output_len: int
    max_new_tokens: int
    #: the request's priority, vLLM's: a lower value is served earlier, 0 by default. The core
    #: accepts a non-zero one only where the policy sets :attr:`SchedulingPolicy.uses_priority`
    #: (versionadded 2.5; last, so positional construction of the six fields above still works)
    priority: int = 0

    @property
    def remaining_prefill(self) -> int:
        return self.prompt_len - self.num_computed


class Budgets(NamedTuple):
    #: most new tokens one prefill step may process (``max_prefill_tokens``; with mixed steps,
    #: less one per running request, whose decodes ride along in the step: versionchanged 2.0)
    prefill_tokens: int
    #: KV tokens that can still be promised (free + evictable - expected growth of admitted requests)
    free_kv_tokens: int
    #: request rows free in the page table
    free_request_slots: int
    #: share of a request's remaining ``max_new_tokens`` the core expects to need KV for. The core
    #: lowers it while requests finish early and raises it after it had to retract one.
    #: (versionadded 1.1)
    output_reserve_ratio: float = 1.0

    def kv_to_admit(self, request: RequestView, cached_prefix_len: int) -> int:
        """KV tokens admitting ``request`` takes out of ``free_kv_tokens`` (versionadded 1.1)."""
        expected_output = math.ceil(self.output_reserve_ratio * request.max_new_tokens)
        return request.remaining_prefill - cached_prefix_len + expected_output


@dataclass(frozen=True)
class SchedulerState:
    #: requests whose prompt is not fully prefilled yet; a partly prefilled one has num_computed > 0
    waiting: Sequence[RequestView]
    #: requests in decode
    running: Sequence[RequestView]
    budgets: Budgets
    #: length of the cached prefix ``rid`` would reuse if admitted now (queries the cache plugin)
    cached_prefix_len: Callable[[int], int]


class PrefillPlan(NamedTuple):
    #: (rid, number of prompt tokens to prefill this step) in the order to run them
    chunks: list[tuple[int, int]]


class DecodePlan(NamedTuple):
    rids: list[int]


class SchedulingPolicy(ABC):
    #: the policy orders requests by :attr:`RequestView.priority`. Without it the server refuses a
    #: request with a non-zero ``priority`` (a 400, as vLLM's without ``--scheduling-policy
    #: priority``) and the offline ``LLM`` raises ValueError, rather than run it in an order its
    #: client did not ask for. The scheduler reports it in its ready handshake, so the API server
    #: knows it without importing the policy. (versionadded 2.5)
    uses_priority: ClassVar[bool] = False

    @abstractmethod
    def schedule(self, state: SchedulerState) -> PrefillPlan | DecodePlan | None:
        """Return the next step's plan, or None when nothing can run.

        Rules the core enforces: a prefill chunk's tokens count against ``prefill_tokens``;
        admitting a waiting request with ``num_computed == 0`` needs a free request slot and
        ``budgets.kv_to_admit(request, cached_prefix_len)`` KV tokens out of ``free_kv_tokens``
        (the cached prefix does not count). A decode plan names running requests only. When
        decode runs out of KV the core retracts running requests (the least urgent first, the
        largest ``priority``, then the newest; versionchanged 2.5: newest first): they return to
        ``waiting`` with their output so far as part of the prompt.

        A return value that is no plan, an exception, or plans that run nothing for 3 rounds in
        a row while requests wait or run, are logged once naming the plugin, and the core plans
        such steps itself (arrival order): a policy mistake never stalls or fails accepted
        requests.
        """


def plan_prefill(state: SchedulerState, order: Iterable[RequestView]) -> PrefillPlan | None:
    """A prefill plan that fills ``state``'s budgets from ``order`` (a policy's ordering of
    ``state.waiting``; partly prefilled requests must come first), or None when nothing fits.

    Each new request is admitted while a request slot is free and its
    ``budgets.kv_to_admit(request, cached_prefix_len)`` fits the KV left; it is given its prompt
    less the cached prefix, cut to the token budget left. It stops at the first new request that
    does not fit, so later ones never overtake it (a policy that wants them to calls it again on
    the rest). What prefill-first, lpm and priority plan with: a policy orders, this fills.
    (versionadded 2.5; prefill-first's ``plan_prefill`` before)"""
    budget = state.budgets.prefill_tokens
    free_rows = state.budgets.free_request_slots
    free_kv = state.budgets.free_kv_tokens
    chunks: list[tuple[int, int]] = []
    for req in order:
        if budget <= 0:
            break
        remaining = req.remaining_prefill
        if req.num_computed == 0:
            cached = state.cached_prefix_len(req.rid)
            need = state.budgets.kv_to_admit(req, cached)
            if free_rows == 0 or need > free_kv:
                break
            free_rows -= 1
            free_kv -= need
            remaining = req.prompt_len - cached
        n = min(remaining, budget)
        chunks.append((req.rid, n))
        budget -= n
    return PrefillPlan(chunks) if chunks else None
