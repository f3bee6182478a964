"""Entry point of the longest-prefix-match scheduling policy (thin: no heavy imports)."""

from minisgl_core.api import hookimpl

MINISGL_API = "2.5"


@hookimpl
def minisgl_register_policies(register):
    register("lpm", "minisgl_plugin_lpm.policy:LongestPrefixMatchPolicy")
