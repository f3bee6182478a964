"""Conformance suite for scheduling policies: subclass it, point it at a policy, run pytest.

    from minisgl_core.testing.policy_suite import SchedulingPolicySuite

    class TestMyPolicy(SchedulingPolicySuite):
        policy_cls = "mine"      # a registered name, "module:Class", or the class itself
        starvation_bound = 100   # rounds a request may wait while preferred ones keep arriving

Every test runs the policy inside the core's real scheduler with a fake model
(:mod:`minisgl_core.testing.policy_sim`), under budgets tight enough to bind, and checks each
plan against the budgets it was given, that every request finishes exactly once with all its
tokens, that aborted requests are never planned again, and that all KV and request slots are free
at the end. Capabilities: ``"chunked_prefill"`` (prompts longer than the prefill budget) and
``"bounded_starvation"``; declare them as ``capabilities`` on the policy class or on the suite
subclass. Tests of undeclared capabilities are skipped.
"""

from __future__ import annotations

import random
from types import FunctionType
from typing import Any, ClassVar

import pytest

from minisgl_core.api import CacheManager, SchedulingPolicy
from minisgl_core.testing.policy_sim import Simulation
from minisgl_core.testing.targets import build, resolve  # (resolve also imported from here by name: kept)

KNOWN_CAPABILITIES = frozenset({"chunked_prefill", "bounded_starvation"})


def random_workload(
    rng: random.Random, count: int, *, max_prompt: int, rounds: int
) -> list[tuple[int, list[int], int]]:
    """``count`` (arrival round, prompt, max_new_tokens) where most prompts start with one of three
    shared "system prompts", so a prefix cache has something to reuse."""
    system = [[rng.randrange(100, 200) for _ in range(rng.randrange(4, max_prompt // 2))] for _ in range(3)]
    workload = []
    for _ in range(count):
        head = rng.choice(system) if rng.random() < 0.7 else []
        tail = [rng.randrange(200, 300) for _ in range(rng.randrange(1, max_prompt - len(head) + 1))]
        workload.append((rng.randrange(rounds), head + tail, rng.randrange(1, 9)))
    return sorted(workload, key=lambda w: w[0])


class SchedulingPolicySuite:
    #: the policy: its class, "package.module:Class", or a name registered by an installed plugin
    policy_cls: ClassVar[type[SchedulingPolicy] | str | None] = None
    #: None: the policy class's own ``capabilities`` if it has any, else every known capability
    capabilities: ClassVar[frozenset[str] | None] = None
    #: most scheduling rounds a request may wait for admission while preferred requests keep arriving
    starvation_bound: ClassVar[int] = 256
    #: prefix caches to simulate with, first installed one wins (registered --cache names)
    cache_names: ClassVar[tuple[str, ...]] = ("radix", "naive")
    #: one random-arrival run per seed
    seeds: ClassVar[tuple[int, ...]] = (0, 1, 2)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # ``policy_class = Mine`` (for policy_cls) replaced the suite's method of that name, and
        # every test failed with "issubclass() arg 1 must be a class"
        own = cls.__dict__.get("policy_class")
        if own is not None and not isinstance(own, (classmethod, staticmethod, FunctionType)):
            raise TypeError(
                f"{cls.__name__} sets policy_class, the suite's own method: set policy_cls = "
                f"{getattr(own, '__name__', repr(own))} (the policy under test) instead"
            )

    # --- hooks a subclass may override ---

    def make_policy(self) -> SchedulingPolicy:
        return build(self.policy_class())

    def make_cache(self) -> CacheManager:
        from minisgl_core.plugins import PluginError

        for name in self.cache_names:
            try:
                return resolve("caches", name)(page_size=1)
            except PluginError:
                continue
        pytest.skip(f"no prefix cache plugin installed (tried {', '.join(self.cache_names)})")

    # --- plumbing ---

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        if "seed" in metafunc.fixturenames:
            metafunc.parametrize("seed", self.seeds)

    @classmethod
    def policy_class(cls) -> type[SchedulingPolicy]:
        if cls.policy_cls is None:
            raise TypeError(f"{cls.__name__} must set policy_cls")
        return resolve("policies", cls.policy_cls)

    def declared(self) -> frozenset[str]:
        own = getattr(self.policy_class(), "capabilities", None)
        if self.capabilities is not None:
            return frozenset(self.capabilities)
        return frozenset(own) if own is not None else KNOWN_CAPABILITIES

    def require(self, capability: str) -> None:
        if capability not in self.declared():
            pytest.skip(f"policy does not declare {capability!r}")

    def simulation(
        self, *, kv_tokens: int = 160, max_requests: int = 4, prefill_tokens: int = 24, mixed: bool = False
    ) -> Simulation:
        return Simulation(
            self.make_policy(), self.make_cache(), kv_tokens, max_requests, prefill_tokens, mixed=mixed
        )

    def run(
        self, sim: Simulation, workload: list[tuple[int, list[int], int]], max_rounds: int = 2000
    ) -> None:
        """Add each request at its round, step until everything finished, assert a clean report."""
        pending = list(enumerate(workload))
        for _ in range(max_rounds):
            while pending and pending[0][1][0] <= sim.round:
                rid, (_, prompt, max_new) = pending.pop(0)
                sim.add(rid, prompt, max_new)
            if not pending and not sim.scheduler.has_work:
                break
            if not sim.step() and sim.scheduler.has_work and not pending:
                sim.run_until_idle(1)  # records the stall
                break
        self.assert_clean(sim)

    def assert_clean(self, sim: Simulation) -> None:
        problems = sim.report()
        assert not problems, f"{len(problems)} problem(s), first ones:\n  " + "\n  ".join(problems[:8])

    # --- the tests ---

    def test_capabilities_are_known(self) -> None:
        assert issubclass(self.policy_class(), SchedulingPolicy)
        unknown = self.declared() - KNOWN_CAPABILITIES
        assert not unknown, f"unknown capabilities {sorted(unknown)}; known: {sorted(KNOWN_CAPABILITIES)}"

    def test_idle_policy_plans_nothing(self) -> None:
        sim = self.simulation()
        assert sim.checked.schedule(sim.scheduler.state()) is None
        assert not sim.checked.violations

    def test_single_request(self) -> None:
        sim = self.simulation()
        self.run(sim, [(0, [5, 6, 7, 8], 5)])
        assert sim.admitted[0] == 1, "a lone request that fits must be admitted in the first round"

    def test_random_arrivals_under_tight_budgets(self, seed: int) -> None:
        """Requests arrive over time; KV, request slots and the prefill budget all bind."""
        rng = random.Random(seed)
        workload = random_workload(rng, 40, max_prompt=24, rounds=60)
        self.run(self.simulation(kv_tokens=80), workload)

    def test_repeated_prompts_reuse_the_cache(self) -> None:
        """The same prompts twice (cached prefixes, locked while in use, evicted under pressure)."""
        rng = random.Random(7)
        first = random_workload(rng, 20, max_prompt=20, rounds=1)
        workload = first + [(200 + i, prompt, new) for i, (_, prompt, new) in enumerate(first)]
        self.run(self.simulation(kv_tokens=120), workload)

    def test_long_prompts_are_chunked(self) -> None:
        self.require("chunked_prefill")
        rng = random.Random(3)
        workload = random_workload(rng, 24, max_prompt=90, rounds=30)
        sim = self.simulation(kv_tokens=200, prefill_tokens=16)
        self.run(sim, workload)

    def test_mixed_steps(self, seed: int) -> None:
        """(API 2.0) The core's mixed steps (its default where the attention backend allows): a
        prefill plan also runs one token of every running request, and ``budgets.prefill_tokens``
        is lowered by one per running request for them. A policy needs nothing new: random
        arrivals with long prompts under tight budgets, nothing lost, duplicated or leaked."""
        rng = random.Random(seed)
        chunked = "chunked_prefill" in self.declared()  # else prompts fit the lowered budget
        workload = random_workload(rng, 30, max_prompt=60 if chunked else 12, rounds=40)
        sim = self.simulation(kv_tokens=160, prefill_tokens=20, mixed=True)
        self.run(sim, workload)

    def test_aborts_at_every_stage(self) -> None:
        """Abort one request while it waits, one partly prefilled and one decoding; the policy
        never plans them again and everything else completes."""
        rng = random.Random(11)
        sim = self.simulation(kv_tokens=200, max_requests=3, prefill_tokens=8)
        for rid, (_, prompt, _) in enumerate(random_workload(rng, 12, max_prompt=30, rounds=1)):
            sim.add(rid, prompt, 6)
        stages = {
            "waiting": lambda s: [r for r in s.waiting.values() if not r.admitted],
            "partly prefilled": lambda s: [r for r in s.waiting.values() if r.admitted],
            "decoding": lambda s: list(s.running.values()),
        }
        done: set[str] = set()
        for _ in range(500):
            for stage, candidates in stages.items():
                found = candidates(sim.scheduler)
                if stage not in done and found:
                    sim.abort(found[-1].rid)
                    done.add(stage)
            if not sim.scheduler.has_work or not sim.step():
                break
        sim.run_until_idle(500)
        self.assert_clean(sim)
        assert done == set(stages), f"the workload never reached stages {set(stages) - done}"

    def test_bounded_starvation(self) -> None:
        """A long, uncached request with a long output arrives into a stream of short requests that
        share a cached prefix, want few tokens and arrive later: whatever a policy prefers, the
        stream has more of it. Request slots are scarce and the stream outpaces them, so a policy
        without a guard can postpone the victim forever."""
        self.require("bounded_starvation")
        sim = self.simulation(kv_tokens=4096, max_requests=2, prefill_tokens=64)
        hot = list(range(100, 116))
        victim, victim_arrival, rid = -1, 6, 0
        deadline = victim_arrival + self.starvation_bound + 1
        while sim.round < deadline and victim not in sim.admitted:
            if sim.round == victim_arrival:
                sim.add(victim, list(range(300, 348)), 8)
            sim.add(rid, hot + [200 + rid % 50, 250 + rid % 7], 4)
            rid += 1
            sim.step()
        waited = sim.waiting_rounds(victim)
        assert victim in sim.admitted, (
            f"request {victim} waited {waited} rounds (> starvation_bound={self.starvation_bound}) "
            f"while {rid} preferred requests arrived"
        )
        sim.run_until_idle(20 * rid + 200)
        self.assert_clean(sim)
