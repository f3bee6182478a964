"""Where a model's sampling defaults come from: ``--generation-config auto|vllm|none|PATH``.

A request (HTTP or offline) that leaves a sampling field unset gets the model's default for it,
and a field the model does not set gets SamplingParams' own (OpenAI's) default. ``auto`` reads
the model's own ``generation_config.json``; ``vllm`` and ``none`` ignore it (vLLM's meaning of
``vllm``: the engine's defaults only); any other value is a folder holding a
``generation_config.json``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from minisgl_core.checkpoint.formats import SafetensorsFormat, load_generation_config, open_model
from minisgl_core.model_dir import eos_token_ids
from minisgl_core.sampling import UNSUPPORTED_GENERATION_KEYS, SamplingParams, sampling_defaults
from minisgl_core.setting_names import Spelling, given

if TYPE_CHECKING:
    from minisgl_core.api.weights import WeightFormat
    from minisgl_core.plugins import Plugins

logger = logging.getLogger(__name__)

AUTO = "auto"
#: settings that ignore the model's defaults
ENGINE_ONLY = ("vllm", "none")


class GenerationConfigError(ValueError):
    """The generation config cannot be used; the message names the file and the fix."""


def unusable(exc: ValueError) -> GenerationConfigError:
    """A model's generation config that cannot be read, as the error users see: the file and
    what is wrong with it (``exc``), then what to do."""
    return GenerationConfigError(f"{exc}; fix it, or remove it")


def end_of_sequence(
    source: WeightFormat, hf_config: dict[str, Any] | None = None, vocab_size: int | None = None
) -> tuple[dict[str, Any], set[int]]:
    """The model's own generation config and the ids that end its generation, read whatever
    ``--generation-config`` says (the engine, and ``serve`` before it starts one), as
    :class:`GenerationConfigError` naming the file and the fix where they cannot be used. Ids
    of ``vocab_size`` or more, which the model cannot produce, are dropped with a warning (a
    request's ``min_tokens`` banned them by index: out of range)."""
    try:
        generation_config = source.generation_config()
    except ValueError as exc:
        raise unusable(exc) from exc
    try:
        ids = eos_token_ids(
            source.hf_config() if hf_config is None else hf_config, generation_config, source.path
        )
    except ValueError as exc:
        raise GenerationConfigError(str(exc)) from exc
    outside = sorted(i for i in ids if vocab_size is not None and i >= vocab_size)
    if outside:
        logger.warning(
            "%s: end-of-sequence id(s) %s are outside the vocabulary of %d; ignored",
            source.path,
            outside,
            vocab_size,
        )
    return generation_config, ids.difference(outside)


def _spelling(plugins: Plugins | None) -> Spelling:
    """How errors name the setting: ``--generation-config`` or, offline, ``generation_config=``."""
    return plugins.spelling if plugins is not None else "flag"


def model_generation_config(model: str | Path, plugins: Plugins | None = None) -> dict[str, Any]:
    """The model's own generation config: a directory's ``generation_config.json``, or what its
    weight format reads (a GGUF's metadata). The one place that knows where a model keeps it."""
    path = Path(model)
    # a directory's own file unless it loads as GGUF (open_model's choice: config.json decides)
    if path.is_dir() and (SafetensorsFormat.detect(path) or not any(path.glob("*.gguf"))):
        # (not "start with --generation-config none": the end-of-sequence ids are read from it anyway)
        try:
            return load_generation_config(path)
        except ValueError as exc:
            raise unusable(exc) from exc
    try:
        return open_model(path, plugins).generation_config()
    except (OSError, ValueError):
        return {}  # not a model this installation reads: the model checks say so in one line


def _is_file(path: Path) -> bool:
    """``path.is_file()``, False where the path cannot be looked up (a name too long was an
    OSError traceback)."""
    try:
        return path.is_file()
    except OSError:
        return False


def _read_folder(folder: Path, spelling: Spelling) -> dict[str, Any]:
    # the file itself named is taken too (it said "no generation_config.json there")
    path = (
        folder
        if folder.name == "generation_config.json" and _is_file(folder)
        else folder / "generation_config.json"
    )
    setting = given("generation_config", folder, spelling)
    if not _is_file(path):
        raise GenerationConfigError(
            f"{setting}: no generation_config.json there; give a folder holding one, "
            f"or one of {AUTO}, {', '.join(ENGINE_ONLY)}"
        )
    # (these said only the file's path and what was wrong: not the flag, nor the way out)
    fix = f"fix it, or give {given('generation_config', AUTO, spelling)} (the model's own) or {given('generation_config', 'none', spelling)}"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as exc:  # (the last: nested too deep to decode)
        raise GenerationConfigError(f"{setting}: {path} is unreadable ({exc}); {fix}") from exc
    if not isinstance(config, dict):
        raise GenerationConfigError(
            f"{setting}: {path} must hold a JSON object, got {type(config).__name__}; {fix}"
        )
    return config


def load_sampling_defaults(
    model: str | Path, setting: str = AUTO, plugins: Plugins | None = None
) -> dict[str, Any]:
    """The SamplingParams fields a request inherits when it leaves them unset, checked for range."""
    if setting in ENGINE_ONLY:
        return {}
    spelling = _spelling(plugins)
    if not str(setting).strip():  # (Path("") is ".": the message named the working directory)
        raise GenerationConfigError(
            f"{given('generation_config', setting, spelling, quote=True)} is empty; give a folder holding "
            f"generation_config.json, or one of {AUTO}, {', '.join(ENGINE_ONLY)}"
        )
    source = (
        model_generation_config(model, plugins) if setting == AUTO else _read_folder(Path(setting), spelling)
    )
    ignored = {
        k: source[k] for k in UNSUPPORTED_GENERATION_KEYS if source.get(k) not in (None, 1, 1.0, 0, 0.0)
    }
    whose = (
        "the model's generation config" if setting == AUTO else given("generation_config", setting, spelling)
    )
    if ignored:
        logger.warning("%s sets %s, which minisgl does not implement; ignored", whose, ignored)
    defaults = sampling_defaults(source)
    try:
        # max_tokens may be absent (then each request gets what the context leaves)
        SamplingParams(**{"max_tokens": 1, **defaults})
    except (TypeError, ValueError) as exc:
        raise GenerationConfigError(
            f"{whose} has an invalid default: {exc}; fix it, or start with "
            f"{given('generation_config', 'none', spelling)}"
        ) from exc
    return defaults


def describe(defaults: dict[str, Any]) -> str:
    """One line for the start-up log."""
    if not defaults:
        return "requests' unset sampling fields take the OpenAI defaults (the model sets none)"
    fields = " ".join(f"{k}={v}" for k, v in defaults.items())
    return f"requests' unset sampling fields take the model's defaults: {fields}"
