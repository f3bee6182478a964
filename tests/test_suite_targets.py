"""Every conformance suite takes the class it tests as the class itself, as ``"module:Class"`` or
as the name an installed plugin registers. The cache, weight-format and quantization suites took
only a class: ``cache_cls = "radix"`` failed in the suite's own code ('str' object has no
attribute '__name__'), where the attention, policy, grammar, parser and model suites took all three."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from minisgl_plugin_int8.method import Int8Method
from minisgl_plugin_radix.cache import RadixCache

from minisgl_core.checkpoint.formats import SafetensorsFormat
from minisgl_core.testing.cache_suite import CacheManagerSuite
from minisgl_core.testing.format_suite import WeightFormatSuite
from minisgl_core.testing.quantization_suite import QuantizationMethodSuite

pytest_plugins = ["minisgl_core.testing.pytest_plugin"]


class TestCacheByRegisteredName(CacheManagerSuite):
    cache_cls = "radix"  # (radix declares prefix_reuse: the capability checks read the class)
    page_sizes = (4,)
    hypothesis_settings = settings(
        max_examples=10, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
    )


class TestQuantizationByRegisteredName(QuantizationMethodSuite):
    method_cls = "int8"
    max_relative_error = 0.03  # (int8's own conformance test says why)


class TestFormatByTarget(WeightFormatSuite):
    format_cls = "minisgl_core.checkpoint.formats:SafetensorsFormat"  # the core's own: no name
    architectures = ("LlamaForCausalLM",)

    def write(self, hf_dir: Path, out_dir: Path) -> Path:
        shutil.copytree(hf_dir, out_dir, dirs_exist_ok=True)
        return out_dir


@pytest.mark.parametrize(
    ("suite", "setting", "accessor", "forms", "cls"),
    [
        (CacheManagerSuite, "cache_cls", "cache_class", ["radix", "minisgl_plugin_radix.cache:RadixCache"], RadixCache),
        (QuantizationMethodSuite, "method_cls", "method_class", ["int8", "minisgl_plugin_int8.method:Int8Method"], Int8Method),
        (WeightFormatSuite, "format_cls", "format_class", ["minisgl_core.checkpoint.formats:SafetensorsFormat"], SafetensorsFormat),
    ],
    ids=["cache", "quantization", "format"],
)  # fmt: skip
def test_each_form_gives_the_class(suite, setting, accessor, forms, cls) -> None:
    for form in [cls, *forms]:
        subclass = type("TestMine", (suite,), {setting: form})
        assert getattr(subclass, accessor)() is cls, form
    with pytest.raises(TypeError, match=f"TestUnset must set {setting}"):
        getattr(type("TestUnset", (suite,), {}), accessor)()
