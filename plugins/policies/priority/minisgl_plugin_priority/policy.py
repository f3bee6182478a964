"""Priority scheduling (vLLM's ``--scheduling-policy priority``): the waiting requests are admitted
by their ``priority`` (lower first, as vLLM's), then by arrival; :func:`plan_prefill`
(the API's) fills the budgets in that order.

Requests already partly prefilled come first whatever their priority: they hold KV and a request
slot, and a new request that did not fit ahead of them could never be admitted while they wait
(vLLM's chunked prefills, in its running queue, go first too). Decode runs every running request.

A new request that does not fit waits, and the less urgent ones behind it wait too (they would
take the KV it waits for), while requests run; when none runs, nothing would free that KV, so the
next ones that fit are admitted instead.

Not vLLM's: a running request is never set back to make room for a more urgent one. When decode
runs out of KV the core retracts the least urgent request first (then the newest), as vLLM does.
"""

from __future__ import annotations

from typing import ClassVar

from minisgl_core.api import DecodePlan, PrefillPlan, SchedulerState, SchedulingPolicy, plan_prefill


class PriorityPolicy(SchedulingPolicy):
    uses_priority = True
    #: a stream of more urgent requests postpones a less urgent one for as long as it lasts, by
    #: design: no bounded starvation
    capabilities: ClassVar[frozenset[str]] = frozenset({"chunked_prefill"})

    def schedule(self, state: SchedulerState) -> PrefillPlan | DecodePlan | None:
        order = sorted(state.waiting, key=lambda r: (r.num_computed == 0, r.priority, r.arrival))
        plan = plan_prefill(state, order)
        if plan is not None:
            return plan
        if state.running:
            return DecodePlan([r.rid for r in state.running])
        # Nothing runs, so nothing will free KV for the request at the head of the order: the
        # next ones that fit go now rather than the engine idling (the one ahead keeps its place)
        for skip in range(1, len(order)):
            plan = plan_prefill(state, order[skip:])
            if plan is not None:
                return plan
        return None
