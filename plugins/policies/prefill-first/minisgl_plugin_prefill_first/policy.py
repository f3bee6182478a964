"""Prefill-first, first-come-first-served admission with chunked prefill."""

from __future__ import annotations

from minisgl_core.api import DecodePlan, PrefillPlan, SchedulerState, SchedulingPolicy, plan_prefill

#: (the budget filling moved into the API as ``minisgl_core.api.plan_prefill`` with API 2.5; this
#: name stays for code that imported it from here)
__all__ = ["PrefillFirstPolicy", "plan_prefill"]


class PrefillFirstPolicy(SchedulingPolicy):
    def schedule(self, state: SchedulerState) -> PrefillPlan | DecodePlan | None:
        order = sorted(state.waiting, key=lambda r: (r.num_computed == 0, r.arrival))
        plan = plan_prefill(state, order)
        if plan is not None:
            return plan
        if state.running:
            return DecodePlan([r.rid for r in state.running])
        return None
