"""Longest-prefix-match-first admission (SGLang's cache-aware ordering) with a starvation guard.

Each step the waiting requests are ordered, then the API's :func:`plan_prefill` fills the
budgets in that order:

1. requests already partly prefilled (they hold KV; finishing them first frees it soonest);
2. requests that have waited ``max_wait_rounds`` scheduling rounds or more, in arrival order:
   the guard that keeps a request whose prefix is never cached from waiting forever behind a
   stream of requests that share a hot prefix;
3. the rest by the length of their cached prefix, longest first, then by arrival.

Running the requests that reuse the cached prefixes now, before admitting others whose KV
would evict those prefixes, is what raises the prefix-cache hit rate over first-come-first-served.
"""

from __future__ import annotations

import dataclasses
from functools import cache

from minisgl_core.api import DecodePlan, PrefillPlan, SchedulerState, SchedulingPolicy, plan_prefill


class LongestPrefixMatchPolicy(SchedulingPolicy):
    def __init__(self, max_wait_rounds: int | None = 64, max_sorted_queue: int = 128) -> None:
        #: rounds (calls of :meth:`schedule`) after which a waiting request goes ahead of the
        #: cache-preferred ones; None turns the guard off (unbounded starvation is then possible)
        self.max_wait_rounds = max_wait_rounds
        #: with more new requests than this waiting, order by arrival: matching every prompt
        #: against the cache each step would cost more than the reuse saves (SGLang uses 128 too)
        self.max_sorted_queue = max_sorted_queue
        self._round = 0
        #: rid -> the round this policy first saw it waiting
        self._first_seen: dict[int, int] = {}

    def schedule(self, state: SchedulerState) -> PrefillPlan | DecodePlan | None:
        self._round += 1
        # Forget requests that left the queue (admitted or aborted), so the table stays small.
        self._first_seen = {r.rid: self._first_seen.get(r.rid, self._round) for r in state.waiting}
        # Each cached_prefix_len call walks the cache; the ordering and plan_prefill share one answer.
        state = dataclasses.replace(state, cached_prefix_len=cache(state.cached_prefix_len))

        partial = sorted((r for r in state.waiting if r.num_computed > 0), key=lambda r: r.arrival)
        new = [r for r in state.waiting if r.num_computed == 0]
        overdue = [r for r in new if self._overdue(r.rid)]
        rest = [r for r in new if not self._overdue(r.rid)]
        if len(rest) <= self.max_sorted_queue:
            rest.sort(key=lambda r: (-state.cached_prefix_len(r.rid), r.arrival))
        else:
            rest.sort(key=lambda r: r.arrival)
        overdue.sort(key=lambda r: r.arrival)

        plan = plan_prefill(state, partial + overdue + rest)
        if plan is not None:
            return plan
        if state.running:
            return DecodePlan([r.rid for r in state.running])
        return None

    def _overdue(self, rid: int) -> bool:
        if self.max_wait_rounds is None:
            return False
        return self._round - self._first_seen[rid] >= self.max_wait_rounds
