"""Every hook a plugin may implement.

pluggy is used at start-up and shutdown only; the per-step hot path calls the selected backend
objects directly. Registration hooks receive a ``register`` callback and name implementations
lazily as ``"module:attribute"`` strings, so discovering a plugin never imports a kernel.
All parameters are passed by keyword.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    import argparse

    from minisgl_core.api.process import ProcessContext

PROJECT = "minisgl"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

#: ``register(name, target)``: ``target`` is ``"package.module:ClassName"``, imported on first use.
Register = Callable[[str, str], None]


@hookspec
def minisgl_register_models(register: Register) -> None:
    """Register model classes under the Hugging Face architecture names they implement.

    ``register("Qwen3ForCausalLM", "minisgl_plugin_qwen3.model:Qwen3ForCausalLM")``. The class must
    subclass :class:`minisgl_core.api.Model`. The core picks it by the first entry of
    ``architectures`` in the model's ``config.json``.

    Runs once per process at plugin load, in every process.

    .. versionadded:: 1.0
    """


@hookspec
def minisgl_register_attention_backends(register: Register) -> None:
    """Register attention backends by the name users pass to ``--attn``.

    ``register("fi", "minisgl_plugin_fi.backend:FlashInferBackend")``. The class must subclass
    :class:`minisgl_core.api.AttentionBackend`.

    Runs once per process at plugin load, in every process.

    .. versionadded:: 1.0
    """


@hookspec
def minisgl_register_caches(register: Register) -> None:
    """Register prefix-cache managers by the name users pass to ``--cache``.

    The class must subclass :class:`minisgl_core.api.CacheManager`.

    Runs once per process at plugin load, in every process.

    .. versionadded:: 1.0
    """


@hookspec
def minisgl_register_policies(register: Register) -> None:
    """Register scheduling policies by the name users pass to ``--policy``.

    The class must subclass :class:`minisgl_core.api.SchedulingPolicy`; it is built with no
    arguments, or with ``ctx=`` the process's :class:`ProcessContext` when its constructor takes
    ``ctx`` (API 2.9; so do caches and parsers).

    Runs once per process at plugin load, in every process.

    .. versionadded:: 1.0
    """


@hookspec
def minisgl_register_weight_formats(register: Register) -> None:
    """Register weight formats: readers for model files other than safetensors directories.

    ``register("gguf", "minisgl_plugin_gguf.format:GGUFFormat")``. The class must subclass
    :class:`minisgl_core.api.WeightFormat`. When the user passes ``--model PATH``, the core uses
    safetensors for a directory with ``config.json``, else the first registered format (by name)
    whose ``detect(PATH)`` is true; it reads config, tokenizer and weights through it.

    Runs once per process at plugin load, in every process.

    .. versionadded:: 1.6
    """


@hookspec
def minisgl_register_tool_parsers(register: Register) -> None:
    """Register tool-call parsers by the name users pass to ``--tool-call-parser``.

    ``register("hermes", "minisgl_plugin_hermes.parser:HermesToolParser")``. The class must
    subclass :class:`minisgl_core.api.ToolParser` (most formats subclass
    :class:`minisgl_core.api.JsonToolCallParser` and set its attributes; another shape is written
    once, as a stream, on :class:`minisgl_core.api.StreamingToolParser`); the API server makes one
    per choice of a chat request that offers ``tools``, with the request's tools.

    Runs once per process at plugin load, in every process.

    .. versionadded:: 1.6
    """


@hookspec
def minisgl_register_reasoning_parsers(register: Register) -> None:
    """Register reasoning parsers by the name users pass to ``--reasoning-parser``.

    ``register("qwen3", "minisgl_plugin_qwen3_reasoning.parser:Qwen3ReasoningParser")``. The class
    must subclass :class:`minisgl_core.api.ReasoningParser` and take no constructor arguments (or
    only ``ctx``, the process's :class:`ProcessContext`, since API 2.9); the API server makes one
    per choice of every chat request.

    Runs once per process at plugin load, in every process.

    .. versionadded:: 1.6
    """


@hookspec
def minisgl_register_grammar_backends(register: Register) -> None:
    """Register grammar backends (constrained decoding) by the name users pass to ``--grammar-backend``.

    ``register("xgrammar", "minisgl_plugin_xgrammar.backend:XGrammarBackend")``. The class must
    subclass :class:`minisgl_core.api.GrammarBackend`; it is built from the served tokenizer in
    the tokenizer worker (to check grammars before admission) and in every scheduler rank.

    Runs once per process at plugin load, in every process.

    .. versionadded:: 1.6
    """


@hookspec
def minisgl_register_quantization_methods(register: Register) -> None:
    """Register weight-quantization methods by the name users pass to ``--quantization``.

    ``register("fp8", "minisgl_plugin_fp8.method:Fp8Method")``. The class must subclass
    :class:`minisgl_core.api.QuantizationMethod`; every scheduler rank builds one and hands it each
    linear layer of the model (create weights, load, process after loading, then ``apply`` on
    every forward).

    Runs once per process at plugin load, in every process.

    .. versionadded:: 2.0
    """


@hookspec
def minisgl_add_cli_options(parser: argparse.ArgumentParser) -> None:
    """Add plugin-specific options to ``minisgl serve`` and ``minisgl shell`` (the commands that
    start server processes; ``generate`` and ``bench`` take none).

    Namespace them with the plugin name (``--fi-workspace-mb``) so plugins never collide. The
    parsed values reach every process through :class:`ProcessContext.options`.

    Runs in the launcher while it builds its argument parser.

    .. versionadded:: 1.0
    """


@hookspec
def minisgl_process_start(ctx: ProcessContext) -> None:
    """Called once when a minisgl process has loaded its plugins and is about to start work.

    ``ctx.role`` is ``"api"``, ``"tokenizer"``, ``"detokenizer"``, ``"scheduler"``, or ``"offline"``
    in a program using the in-process ``LLM`` (its constructor calls this hook, ``LLM.close()`` the
    stop hook); scheduler processes also carry ``ctx.tp_rank``. Use it for per-process set-up (logging,
    warming a JIT cache); ``ctx.resolve(kind, name)`` (API 2.9) gives another plugin's class. An
    exception here stops the process with an error naming the plugin.

    .. versionadded:: 1.0
    """


@hookspec
def minisgl_process_stop(ctx: ProcessContext) -> None:
    """Called once when a minisgl process shuts down cleanly; errors are logged, not raised.

    .. versionadded:: 1.0
    """
