"""Prefill-first, first-come-first-served admission with chunked prefill."""

from __future__ import annotations

from collections.abc import Iterable

from minisgl_core.api import DecodePlan, PrefillPlan, RequestView, SchedulerState, SchedulingPolicy


def plan_prefill(state: SchedulerState, order: Iterable[RequestView]) -> PrefillPlan | None:
    """Fill the prefill budget from ``order`` (partly prefilled requests must come first).

    Stops at the first new request that does not fit, so later ones never overtake it."""
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


class PrefillFirstPolicy(SchedulingPolicy):
    def schedule(self, state: SchedulerState) -> PrefillPlan | DecodePlan | None:
        order = sorted(state.waiting, key=lambda r: (r.num_computed == 0, r.arrival))
        plan = plan_prefill(state, order)
        if plan is not None:
            return plan
        if state.running:
            return DecodePlan([r.rid for r in state.running])
        return None
