"""The policy conformance suite must fail policies with typical bugs: each mutant below has one,
and the suite test named next to it has to fail on it (a suite that cannot fail proves nothing)."""

from __future__ import annotations

import pytest
from minisgl_plugin_lpm.policy import LongestPrefixMatchPolicy
from minisgl_plugin_prefill_first.policy import PrefillFirstPolicy, plan_prefill

from minisgl_core.api import Budgets, DecodePlan, PrefillPlan, SchedulerState
from minisgl_core.testing.policy_suite import SchedulingPolicySuite


class IgnoresKVBudget(PrefillFirstPolicy):
    def schedule(self, state):
        roomy = Budgets(state.budgets.prefill_tokens, 10**9, state.budgets.free_request_slots)
        return super().schedule(SchedulerState(state.waiting, state.running, roomy, state.cached_prefix_len))


class OverfillsPrefillBudget(PrefillFirstPolicy):
    def schedule(self, state):
        plan = super().schedule(state)
        if isinstance(plan, PrefillPlan):
            return PrefillPlan(
                [(rid, n + 1) if i == 0 else (rid, n) for i, (rid, n) in enumerate(plan.chunks)]
            )
        return plan


class ForgetsOddRequests(PrefillFirstPolicy):
    """Never admits a request with an odd id: those are lost."""

    def schedule(self, state):
        kept = [r for r in state.waiting if r.rid % 2 == 0 or r.num_computed > 0]
        return super().schedule(SchedulerState(kept, state.running, state.budgets, state.cached_prefix_len))


class RemembersStaleRequests(PrefillFirstPolicy):
    """Keeps its own queue and never notices that a request was aborted."""

    def __init__(self):
        self.queue = {}

    def schedule(self, state):
        for r in state.waiting:
            self.queue[r.rid] = r
        waiting_now = {r.rid for r in state.waiting}
        self.queue = {rid: r for rid, r in self.queue.items() if rid in waiting_now or r.num_computed == 0}
        order = sorted(self.queue.values(), key=lambda r: (r.num_computed == 0, r.arrival))
        plan = plan_prefill(_with_lenient_cache(state), order)
        return plan or (DecodePlan([r.rid for r in state.running]) if state.running else None)


def _with_lenient_cache(state):
    def cached(rid):
        try:
            return state.cached_prefix_len(rid)
        except KeyError:  # a request the core no longer has
            return 0

    return SchedulerState(state.waiting, state.running, state.budgets, cached)


class ShortestFirstWithoutGuard(PrefillFirstPolicy):
    def schedule(self, state):
        order = sorted(state.waiting, key=lambda r: (r.num_computed == 0, r.prompt_len, r.arrival))
        plan = plan_prefill(state, order)
        return plan or (DecodePlan([r.rid for r in state.running]) if state.running else None)


class IdlesWhileRunning(PrefillFirstPolicy):
    def schedule(self, state):
        plan = super().schedule(state)
        return None if isinstance(plan, DecodePlan) and len(state.running) > 1 else plan


class ForgetsDecodesRideAlong(PrefillFirstPolicy):
    """Plans chunks for the whole ``max_prefill_tokens``, as if mixed steps did not also carry
    one token of every running request."""

    def schedule(self, state):
        b = state.budgets
        full = b._replace(prefill_tokens=b.prefill_tokens + len(state.running))
        return super().schedule(SchedulerState(state.waiting, state.running, full, state.cached_prefix_len))


def lpm_without_guard() -> LongestPrefixMatchPolicy:
    return LongestPrefixMatchPolicy(max_wait_rounds=None)


MUTANTS = [
    (IgnoresKVBudget, "test_random_arrivals_under_tight_budgets", "KV tokens"),
    (OverfillsPrefillBudget, "test_long_prompts_are_chunked", "left to prefill|over the prefill budget"),
    (ForgetsOddRequests, "test_random_arrivals_under_tight_budgets", "never finished|stalled"),
    (RemembersStaleRequests, "test_aborts_at_every_stage", "not waiting"),
    (ShortestFirstWithoutGuard, "test_bounded_starvation", "waited"),
    (lpm_without_guard, "test_bounded_starvation", "waited"),
    (ForgetsDecodesRideAlong, "test_mixed_steps", "over the prefill budget"),
    (
        IdlesWhileRunning,
        "test_random_arrivals_under_tight_budgets",
        "returned None while requests are running",
    ),
]


@pytest.mark.parametrize(("factory", "test_name", "message"), MUTANTS, ids=[m[0].__name__ for m in MUTANTS])
def test_suite_catches(factory, test_name: str, message: str) -> None:
    class Suite(SchedulingPolicySuite):
        policy_cls = PrefillFirstPolicy
        starvation_bound = 100

        def make_policy(self):
            return factory()

    test = getattr(Suite(), test_name)
    with pytest.raises(AssertionError, match=message):
        test(0) if test_name.startswith(("test_random", "test_mixed")) else test()


def test_correct_policies_pass_the_same_tests() -> None:
    """The control: the unmutated policies pass every test the mutants fail."""
    for factory in (PrefillFirstPolicy, LongestPrefixMatchPolicy):

        class Suite(SchedulingPolicySuite):
            policy_cls = PrefillFirstPolicy
            starvation_bound = 100

            def make_policy(self, _factory=factory):
                return _factory()

        suite = Suite()
        for _, test_name, _ in MUTANTS:
            getattr(suite, test_name)(*([0] if test_name.startswith(("test_random", "test_mixed")) else []))


@pytest.mark.parametrize("factory", [PrefillFirstPolicy, LongestPrefixMatchPolicy])
def test_policies_run_unchanged_in_mixed_steps(factory) -> None:
    """The first-party policies under the core's mixed steps: prefill steps really carry the
    running decodes, and every request gets the tokens it gets with mixing off."""
    import random

    from minisgl_core.testing.policy_suite import random_workload

    class Suite(SchedulingPolicySuite):
        policy_cls = factory

    suite = Suite()
    workload = random_workload(random.Random(4), 30, max_prompt=60, rounds=40)
    sims = {}
    for mixed in (True, False):
        sims[mixed] = suite.simulation(kv_tokens=160, prefill_tokens=20, mixed=mixed)
        suite.run(sims[mixed], workload)
    assert sims[True].mixed_steps >= 10
    assert sims[False].mixed_steps == 0
    assert sims[True].outputs == sims[False].outputs
    # with the decodes riding along, the run takes fewer rounds
    assert sims[True].round < sims[False].round


def test_policy_class_set_instead_of_policy_cls_is_named() -> None:
    """``policy_class = Mine`` replaced the suite's method of that name, and every test failed with
    "issubclass() arg 1 must be a class" (a probe writing a policy from the docs)."""
    with pytest.raises(
        TypeError, match=r"sets policy_class, the suite's own method: set policy_cls = PrefillFirstPolicy"
    ):

        class Misspelt(SchedulingPolicySuite):
            policy_class = PrefillFirstPolicy

    class Overrides(SchedulingPolicySuite):  # an override of the method itself is fine
        @classmethod
        def policy_class(cls):
            return PrefillFirstPolicy

    assert Overrides.policy_class() is PrefillFirstPolicy
