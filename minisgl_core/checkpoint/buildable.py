"""Whether the model class config.json selects can build what config.json asks, asked before any
process starts.

The shared decoder (:class:`~minisgl_core.layers.decoder.DecoderForCausalLM`) states what it cannot
build (``unsupported_setting``: a rope type, an activation, a window of no tokens); those limits are the
decoder's, not every model's (a third-party model may build yarn), so the launcher asks the class the
architecture resolves to through the loaded plugins. Without this, ``rope_scaling`` yarn was a
NotImplementedError traceback from a worker once the model was being built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from minisgl_core.checkpoint.formats import ModelPathError

if TYPE_CHECKING:
    from minisgl_core.plugins import Plugins


def unbuildable_message(model_given: str, arch: str, reason: str) -> str:
    """The one line for a model whose config.json asks for what ``arch`` cannot build (the
    launcher's, and the worker's for a model that refuses in its constructor)."""
    return f"{model_given}: {arch} cannot be built from this model's config: {reason}"


def model_config(hf_config: dict[str, Any], plugins: Plugins) -> dict[str, Any]:
    """config.json as the model class its architecture selects reads it (a shared-decoder model's
    ``read_config``: Gemma 3's multimodal checkpoints nest the language model in ``text_config``
    and leave out the keys at their config class's defaults), so the engine's own reads
    (``vocab_size``, ``max_position_embeddings``, the heads) agree with the model's. Unchanged for
    an architecture no plugin provides or whose plugin fails to import (the runner names it)."""
    from minisgl_core.plugins import PluginError

    archs = hf_config.get("architectures")
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        return hf_config
    if archs[0] not in plugins.registry["models"]:
        return hf_config
    try:
        model_cls = plugins.resolve("models", archs[0])
    except PluginError:
        return hf_config
    from minisgl_core.layers.decoder import DecoderForCausalLM

    if isinstance(model_cls, type) and issubclass(model_cls, DecoderForCausalLM):
        return model_cls.read_config(hf_config)
    return hf_config


def check_model_builds(
    hf_config: dict[str, Any], plugins: Plugins, model_given: str, context_len: int | None = None
) -> None:
    """ModelPathError (one line) when ``hf_config``'s architecture resolves to a shared-decoder
    model that cannot build one of its settings for a context of ``context_len`` tokens (None: the
    config's ``max_position_embeddings``). An architecture no plugin provides, whose plugin is
    disabled or fails to import, is the :class:`~minisgl_core.plugins.PluginError` the model runner
    would raise, naming the plugin: raised there, in a scheduler process of ``serve``, it came once
    the workers had started (exit code 1, said twice) instead of as the command line's one line."""
    archs = hf_config.get("architectures")
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        return
    arch = archs[0]
    model_cls = plugins.resolve("models", arch)
    from minisgl_core.layers.decoder import DecoderForCausalLM, unsupported_for

    if isinstance(model_cls, type) and issubclass(model_cls, DecoderForCausalLM):
        reason = unsupported_for(model_cls, hf_config, context_len)
        if reason is not None:
            raise ModelPathError(unbuildable_message(model_given, arch, reason))
