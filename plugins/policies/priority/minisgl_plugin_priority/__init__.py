"""Entry point of the priority scheduling policy (thin: no heavy imports)."""

from minisgl_core.api import hookimpl

MINISGL_API = "2.5"


@hookimpl
def minisgl_register_policies(register):
    register("priority", "minisgl_plugin_priority.policy:PriorityPolicy")
