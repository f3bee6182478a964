"""Entry point of the example plugin: declares the API it needs and names its classes lazily.

Imports only the standard library and minisgl_core.api, so discovering the plugin stays cheap.
"""

from minisgl_core.api import hookimpl

#: the oldest minisgl plugin API this plugin works with (2.5: the policy fills its budgets with
#: plan_prefill; 2.0: the backend reads the page layout the core computes, ForwardBatch.layout)
MINISGL_API = "2.5"


@hookimpl
def minisgl_register_attention_backends(register):
    register("example", "minisgl_plugin_example.attention:ExampleAttentionBackend")


@hookimpl
def minisgl_register_policies(register):
    register("shortest-first", "minisgl_plugin_example.policy:ShortestFirstPolicy")
