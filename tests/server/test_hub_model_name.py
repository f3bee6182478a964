"""A model given as ``ORG/NAME`` (a Hugging Face hub id) is served under that id, as vLLM and
SGLang serve it: its local snapshot's directory is named after the commit hash, which no client
would send as ``model``."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from minisgl_core.checkpoint.resolve import resolve_model, served_model_name
from minisgl_core.demo.factories import demo_model_dir

REVISION = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An offline hub cache holding the demo model as ``org/tiny`` (the layout huggingface_hub
    writes: refs/main names the snapshot's commit)."""
    cache = tmp_path_factory.mktemp("hf")
    repo = cache / "models--org--tiny"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(REVISION)
    shutil.copytree(demo_model_dir(), repo / "snapshots" / REVISION)
    return cache


@pytest.fixture
def offline_hub(hub_cache: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    env = {"HF_HUB_CACHE": str(hub_cache), "HF_HUB_OFFLINE": "1"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    import huggingface_hub.constants as constants  # (read at import: set them for this process too)

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub_cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return env


def test_a_hub_snapshot_is_named_by_its_repo_id(offline_hub, hub_cache):
    path = resolve_model("org/tiny")
    assert Path(path).name == REVISION  # what the server was named before
    assert served_model_name(path) == "org/tiny"
    # other directories keep their name, a file its stem
    assert served_model_name(hub_cache / "models--org--tiny") == "models--org--tiny"
    assert served_model_name(demo_model_dir()) == "demo-qwen3"
    lookalike = hub_cache / "models--a--b--c" / "snapshots" / REVISION  # ("--" is no hub id's)
    assert served_model_name(lookalike) == REVISION


def test_serve_a_hub_id_under_that_id(start_server, offline_hub):
    import openai

    server = start_server(["--model", "org/tiny", "--device", "cpu", "--max-context-len", "256"], offline_hub)
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=120)
    assert [model.id for model in client.models.list()] == ["org/tiny"]
    out = client.completions.create(
        model="org/tiny", prompt="hi", max_tokens=2, extra_body={"ignore_eos": True}
    )
    assert out.model == "org/tiny" and out.usage.completion_tokens == 2
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model=REVISION[:8], prompt="hi", max_tokens=2)
