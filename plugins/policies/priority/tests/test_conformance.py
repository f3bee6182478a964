"""priority against the policy and packaging conformance suites."""

from __future__ import annotations

from minisgl_plugin_priority.policy import PriorityPolicy

from minisgl_core.testing.packaging_suite import PluginPackagingSuite
from minisgl_core.testing.policy_suite import SchedulingPolicySuite


class TestPriorityPolicy(SchedulingPolicySuite):
    policy_cls = "priority"  # through the registry, as the engine finds it

    def test_resolves_to_the_class(self) -> None:
        assert self.policy_class() is PriorityPolicy
        assert PriorityPolicy.uses_priority


class TestPriorityPackaging(PluginPackagingSuite):
    plugin = "priority"
    provides = {"policies": ["priority"]}
