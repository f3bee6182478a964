"""What the priority policy plans: (priority, arrival) order for admission and prefill chunks,
partly prefilled requests first, the budgets as the core checks them (the policy kit's
``plan_problems``), in plans alone and inside the core's scheduler."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from minisgl_plugin_prefill_first.policy import PrefillFirstPolicy
from minisgl_plugin_priority.policy import PriorityPolicy

from minisgl_core.api import Budgets, DecodePlan, PrefillPlan, RequestView, SchedulerState
from minisgl_core.testing.policy_sim import Simulation, plan_problems
from minisgl_core.testing.targets import resolve


def view(
    rid: int, priority: int, prompt_len: int = 10, num_computed: int = 0, max_new: int = 4
) -> RequestView:
    return RequestView(rid, rid, prompt_len, num_computed, 0, max_new, priority)


def state(
    waiting: list[RequestView],
    running: list[RequestView] = (),  # type: ignore[assignment]
    *,
    prefill: int = 1000,
    kv: int = 10_000,
    slots: int = 8,
) -> SchedulerState:
    return SchedulerState(waiting, list(running), Budgets(prefill, kv, slots), lambda rid: 0)


def test_a_view_built_without_priority_has_priority_0() -> None:
    """RequestView.priority is appended with a default: six positional fields still build one."""
    assert RequestView(1, 0, 10, 0, 0, 4).priority == 0


def test_new_requests_are_admitted_by_priority_then_arrival() -> None:
    waiting = [view(0, 3), view(1, -1), view(2, 3), view(3, 0), view(4, -1)]
    plan = PriorityPolicy().schedule(state(waiting))
    assert isinstance(plan, PrefillPlan)
    assert [rid for rid, _ in plan.chunks] == [1, 4, 3, 0, 2]
    # prefill-first, on the same state: arrival order
    assert [rid for rid, _ in PrefillFirstPolicy().schedule(state(waiting)).chunks] == [0, 1, 2, 3, 4]


def test_the_prefill_budget_goes_to_the_most_urgent_first() -> None:
    """Chunked: the budget of 8 tokens goes to the urgent request, which arrived last."""
    waiting = [view(0, 5, prompt_len=20), view(1, -5, prompt_len=20)]
    plan = PriorityPolicy().schedule(state(waiting, prefill=8))
    assert plan == PrefillPlan([(1, 8)])


def test_a_partly_prefilled_request_finishes_before_a_more_urgent_new_one() -> None:
    """It holds KV and a request slot: the new one might never fit while it waits."""
    waiting = [view(0, 5, prompt_len=20, num_computed=8), view(1, -5, prompt_len=20)]
    plan = PriorityPolicy().schedule(state(waiting, prefill=16))
    assert plan == PrefillPlan([(0, 12), (1, 4)])


def test_a_request_that_does_not_fit_is_not_overtaken() -> None:
    """The urgent request needs more KV than is free: a less urgent one that fits waits behind it
    (it would take the KV the urgent one waits for), and the running requests decode. With none
    running nothing would free that KV: the one that fits goes rather than the engine idling (it
    returned None, which the policy kit's checks call a stall; found by the property below)."""
    waiting = [view(0, 0, prompt_len=4), view(1, -1, prompt_len=40)]
    running = [view(7, 0, num_computed=10)]
    plan = PriorityPolicy().schedule(state(waiting, running, kv=20))
    assert plan == DecodePlan([7])
    assert PriorityPolicy().schedule(state(waiting, kv=20)) == PrefillPlan([(0, 4)])


@settings(max_examples=200, deadline=None)
@given(
    requests=st.lists(
        st.tuples(st.integers(-3, 3), st.integers(1, 40), st.booleans(), st.integers(1, 8)),
        min_size=1,
        max_size=12,
    ),
    prefill=st.integers(1, 64),
    kv=st.integers(0, 200),
    slots=st.integers(0, 4),
)
def test_plans_keep_every_budget_and_the_order(requests, prefill, kv, slots) -> None:
    waiting = [
        view(rid, priority, prompt_len, prompt_len // 2 if partly and prompt_len > 1 else 0, max_new)
        for rid, (priority, prompt_len, partly, max_new) in enumerate(requests)
    ]
    s = state(waiting, prefill=prefill, kv=kv, slots=slots)
    plan = PriorityPolicy().schedule(s)
    assert list(plan_problems(s, plan)) == []
    if isinstance(plan, PrefillPlan):
        by_rid = {r.rid: r for r in waiting}
        keys = [(by_rid[rid].num_computed == 0, by_rid[rid].priority, rid) for rid, _ in plan.chunks]
        assert keys == sorted(keys)
        # a new request more urgent than a planned one is left out only where it did not fit (with
        # nothing running, those behind it go rather than the engine idling)
        planned = {rid for rid, _ in plan.chunks}
        new_keys = [k[1:] for k in keys if k[0]]
        if new_keys:
            for r in waiting:
                if r.num_computed == 0 and r.rid not in planned and (r.priority, r.rid) < max(new_keys):
                    need = s.budgets.kv_to_admit(r, s.cached_prefix_len(r.rid))
                    assert need > s.budgets.free_kv_tokens or s.budgets.free_request_slots == 0, r


def admission_order(policy: str, priorities: list[int]) -> list[int]:
    """Requests sent at once to the core's scheduler with one request slot: the order in which
    they were admitted (every plan checked against its budgets, the run checked clean)."""
    sim = Simulation(resolve("policies", policy)(), resolve("caches", "radix")(page_size=1), 200, 1, 16)
    for rid, priority in enumerate(priorities):
        sim.add(rid, [100 + rid] * (10 + rid), 3, priority=priority)
    sim.run_until_idle(500)
    assert sim.report() == []
    return sorted(sim.admitted, key=lambda rid: sim.admitted[rid])


def test_in_the_scheduler_requests_run_by_priority() -> None:
    priorities = [2, 0, -4, 0, 2, -4]
    assert admission_order("priority", priorities) == [2, 5, 1, 3, 0, 4]
    assert admission_order("prefill-first", [0] * 6) == [0, 1, 2, 3, 4, 5]
