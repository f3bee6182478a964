"""lpm against the policy and packaging conformance suites."""

from __future__ import annotations

from minisgl_plugin_lpm.policy import LongestPrefixMatchPolicy

from minisgl_core.testing.packaging_suite import PluginPackagingSuite
from minisgl_core.testing.policy_suite import SchedulingPolicySuite


class TestLongestPrefixMatchPolicy(SchedulingPolicySuite):
    policy_cls = LongestPrefixMatchPolicy
    # the guard admits a request after 64 rounds; the rest is waiting for a request slot to free
    starvation_bound = 80


class TestLpmPackaging(PluginPackagingSuite):
    plugin = "lpm"
    provides = {"policies": ["lpm"]}
