"""prefill-first against the policy and packaging conformance suites."""

from __future__ import annotations

from minisgl_plugin_prefill_first.policy import PrefillFirstPolicy

from minisgl_core.testing.packaging_suite import PluginPackagingSuite
from minisgl_core.testing.policy_suite import SchedulingPolicySuite


class TestPrefillFirstPolicy(SchedulingPolicySuite):
    policy_cls = "prefill-first"  # through the registry, as the engine finds it
    # first come first served: a request waits only for those that arrived before it
    starvation_bound = 32

    def test_resolves_to_the_class(self) -> None:
        assert self.policy_class() is PrefillFirstPolicy


class TestPrefillFirstPackaging(PluginPackagingSuite):
    plugin = "prefill-first"
    provides = {"policies": ["prefill-first"]}
