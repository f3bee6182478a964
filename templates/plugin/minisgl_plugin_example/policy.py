"""Shortest prompt first, with aging: short requests get their first token sooner, and a request
that has waited ``max_wait_rounds`` scheduling rounds goes ahead of everything new, so a long
prompt is never postponed forever by a stream of short ones."""

from __future__ import annotations

from minisgl_core.api import (
    DecodePlan,
    PrefillPlan,
    RequestView,
    SchedulerState,
    SchedulingPolicy,
    plan_prefill,
)


class ShortestFirstPolicy(SchedulingPolicy):
    # Read by the conformance kit: prompts longer than the prefill budget are chunked, and no
    # request waits more than about max_wait_rounds rounds.
    capabilities = frozenset({"chunked_prefill", "bounded_starvation"})

    def __init__(self, max_wait_rounds: int = 32) -> None:
        self.max_wait_rounds = max_wait_rounds
        self._round = 0
        self._first_seen: dict[int, int] = {}  # rid -> round it was first seen waiting

    def schedule(self, state: SchedulerState) -> PrefillPlan | DecodePlan | None:
        self._round += 1
        self._first_seen = {r.rid: self._first_seen.get(r.rid, self._round) for r in state.waiting}

        def order(req: RequestView) -> tuple:
            overdue = self._round - self._first_seen[req.rid] >= self.max_wait_rounds
            # partly prefilled first (they hold KV), then overdue by arrival, then shortest first
            return (req.num_computed == 0, not overdue, 0 if overdue else req.prompt_len, req.arrival)

        # plan_prefill fills the budgets the core gave (it re-checks them all) in this order: each
        # new request needs a row and kv_to_admit's KV (exactly what the core takes to admit it),
        # and it stops at the first that does not fit rather than let later ones overtake it
        plan = plan_prefill(state, sorted(state.waiting, key=order))
        if plan is not None:
            return plan
        if state.running:
            return DecodePlan([r.rid for r in state.running])
        return None
