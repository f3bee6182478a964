"""Entry point of the prefill-first scheduling policy (thin: no heavy imports)."""

from minisgl_core.api import hookimpl

MINISGL_API = "2.5"


@hookimpl
def minisgl_register_policies(register):
    register("prefill-first", "minisgl_plugin_prefill_first.policy:PrefillFirstPolicy")
