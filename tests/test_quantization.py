"""``--quantization`` and ``--kv-cache-dtype``: a third party's method reached through the hook,
the built-in plugins through the engine, the flags, and the errors for what cannot run."""

from __future__ import annotations

import argparse
import textwrap
from importlib import metadata
from pathlib import Path

import pytest
import torch

from minisgl_core.config import EngineConfig
from minisgl_core.engine.engine import Engine
from minisgl_core.plugins import PluginError, Plugins
from minisgl_core.runner.quantization import quantizable_layers
from minisgl_core.sampling import SamplingParams
from minisgl_core.testing import drain

pytest_plugins = ["minisgl_core.testing.pytest_plugin"]

# A third-party method: keeps each weight transposed and counts its products (same math as F.linear).
TOY_PLUGIN = """
from minisgl_core.api import hookimpl
MINISGL_API = "2.0"

@hookimpl
def minisgl_register_quantization_methods(register):
    register("transposed", "minisgl_toy_quant_impl:TransposedMethod")
"""
TOY_IMPL = """
import torch
from minisgl_core.api import QuantizationMethod

class TransposedMethod(QuantizationMethod):
    name = "transposed"
    calls = 0
    created = 0

    def create_weights(self, layer):
        type(self).created += 1

    def process_weights_after_loading(self, layer):
        layer.weight = torch.nn.Parameter(layer.weight.data.t().contiguous(), requires_grad=False)

    def apply(self, layer, x):
        type(self).calls += 1
        return x @ layer.weight
"""


@pytest.fixture
def toy_plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Plugins:
    (tmp_path / "minisgl_toy_quant.py").write_text(textwrap.dedent(TOY_PLUGIN))
    (tmp_path / "minisgl_toy_quant_impl.py").write_text(textwrap.dedent(TOY_IMPL))
    monkeypatch.syspath_prepend(str(tmp_path))
    ep = metadata.EntryPoint("toyquant", "minisgl_toy_quant", "minisgl.plugins")
    plugins = Plugins.load(allow=None, entry_points=[ep, *metadata.entry_points(group="minisgl.plugins")])
    assert plugins.infos[[i.name for i in plugins.infos].index("toyquant")].status == "ok"
    return plugins


def greedy(engine: Engine, prompt: list[int], max_tokens: int = 6) -> list[int]:
    engine.add_request(0, prompt, SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
    return [out.token_id for out in drain(engine) if out.token_id >= 0]


def engine_for(model: Path, plugins: Plugins | None = None, **options) -> Engine:
    config = EngineConfig(model=str(model), device="cpu", attn="torch", num_kv_tokens=512, **options)
    return Engine(config, plugins=plugins or Plugins.load())


def linear_layers(engine: Engine) -> list[torch.nn.Module]:
    return quantizable_layers(engine.runner.model)


def test_minisgl_register_quantization_methods_makes_the_core_use_a_new_method(toy_plugins, tiny_model_dir):
    assert "transposed" in toy_plugins.names("quantization")
    plain = greedy(engine_for(tiny_model_dir, toy_plugins), [5, 6, 7, 8])
    engine = engine_for(tiny_model_dir, toy_plugins, quantization="transposed")
    method_cls = toy_plugins.resolve("quantization", "transposed")
    layers = linear_layers(engine)
    # 2 layers x (qkv, o, gate_up, down); embeddings and the LM head are not handed over
    assert len(layers) == 4 * engine.runner.hf_config["num_hidden_layers"]
    assert method_cls.created == len(layers)
    assert all(isinstance(layer.quant_method, method_cls) for layer in layers)
    calls_before = method_cls.calls
    assert greedy(engine, [5, 6, 7, 8]) == plain
    assert method_cls.calls > calls_before


@pytest.mark.parametrize("name", ["int8", "fp8", "int4"])
def test_built_in_methods_quantize_every_linear_layer(tiny_model_dir, name):
    engine = engine_for(tiny_model_dir, quantization=name)
    # int4 keeps two 4-bit values per byte
    expected = {"int8": torch.int8, "fp8": torch.float8_e4m3fn, "int4": torch.uint8}[name]
    layers = linear_layers(engine)
    assert layers and all(layer.weight.dtype == expected for layer in layers)
    head = engine.runner.model.lm_head
    assert head.weight.dtype == torch.float32 and head.quant_method is None
    assert len(greedy(engine, [5, 6, 7, 8])) == 6


def test_a_mixture_of_experts_keeps_its_experts_and_says_so(make_tiny_model, caplog):
    """--quantization hands a method the linear layers; a MoE block's experts and router are not
    among them, which the log says (a user expecting the experts quantized would otherwise not know)."""
    engine = engine_for(make_tiny_model("Qwen3MoeForCausalLM"), quantization="int8")
    layers = linear_layers(engine)
    # 2 layers x (qkv, o): both layers' MLPs are mixtures of experts
    assert len(layers) == 4 and all(layer.weight.dtype == torch.int8 for layer in layers)
    block = engine.runner.model.model.layers[0].mlp
    assert block.experts.w13.dtype == block.gate.weight.dtype == torch.float32
    assert (
        "2 mixture-of-experts blocks keep their experts and router in float32: --quantization int8"
        in caplog.text
    )
    assert len(greedy(engine, [5, 6, 7, 8])) == 6


@pytest.mark.parametrize("name", ["int4-head", "fp8-head"])
def test_a_method_that_quantizes_the_lm_head_unties_it_from_the_embedding(make_tiny_model, name):
    """int4-head and fp8-head set quantizes_lm_head: the runner hands them the (tied) head after
    loading; the input embedding keeps its float table and the logits stay close to the
    unquantized run's."""
    from minisgl_plugin_int4.method import packed_kernel_is_fast

    if name == "int4-head" and not packed_kernel_is_fast():
        pytest.skip("int4-head quantizes the head only for the packed CPU kernel (AVX-512/AVX2)")
    tied_model_dir = make_tiny_model("Qwen3ForCausalLM", tie_word_embeddings=True)
    plain = engine_for(tied_model_dir)
    engine = engine_for(tied_model_dir, quantization=name)
    model, plain_model = engine.runner.model, plain.runner.model
    assert plain_model.lm_head.weight is plain_model.model.embed_tokens.weight  # tied in this config
    head = model.lm_head
    assert head.quant_method is not None and head not in linear_layers(engine)
    assert head.weight is not model.model.embed_tokens.weight
    assert head.weight.dtype == {"int4-head": torch.uint8, "fp8-head": torch.float8_e4m3fn}[name]
    torch.testing.assert_close(model.model.embed_tokens.weight, plain_model.model.embed_tokens.weight)
    hidden = torch.randn(
        3, engine.runner.hf_config["hidden_size"], generator=torch.Generator().manual_seed(0)
    )
    with torch.inference_mode():
        logits, expected = head(hidden), plain_model.lm_head(hidden)
    assert logits.shape == expected.shape and logits.dtype == torch.float32
    # two int4 terms are closer than e4m3's 3 mantissa bits on weights and activations (3.4% here)
    assert (logits - expected).norm() / expected.norm() < {"int4-head": 0.02, "fp8-head": 0.05}[name]


def test_unknown_method_names_the_installed_ones(tiny_model_dir):
    with pytest.raises(
        PluginError, match=r"unknown --quantization 'awq'; installed: .*fp8, fp8-head, int4, int4-head, int8"
    ):
        engine_for(tiny_model_dir, quantization="awq")


def test_a_method_that_cannot_run_on_the_device_is_one_refusal(toy_plugins, monkeypatch):
    from minisgl_core.config_args import check_plugins_run_on
    from minisgl_core.runner.quantization import make_quantization

    cls = toy_plugins.resolve("quantization", "transposed")
    monkeypatch.setattr(cls, "availability", classmethod(lambda cls, device: "needs a GPU"))
    says = "^--quantization transposed cannot run on cpu: needs a GPU$"
    cpu = torch.device("cpu")
    with pytest.raises(PluginError, match=says):
        check_plugins_run_on({"attn": "torch", "quantization": "transposed"}, toy_plugins, cpu)
    with pytest.raises(PluginError, match=says):
        make_quantization("transposed", toy_plugins, cpu, torch.float32)


def test_fp8_kv_cache_stores_float8_and_stays_close(tiny_model_dir):
    engine = engine_for(tiny_model_dir, kv_cache_dtype="fp8_e4m3")
    assert engine.runner.kv_cache.buffer.dtype == torch.float8_e4m3fn
    prompt = [5, 6, 7, 8, 9, 10, 11]
    params = SamplingParams(temperature=0.0, max_tokens=1, logprobs=5)
    engine.add_request(0, prompt, params)
    reference = engine_for(tiny_model_dir)
    reference.add_request(0, prompt, params)
    outs = [o for o in drain(engine) if o.token_id >= 0]
    refs = [o for o in drain(reference) if o.token_id >= 0]
    assert outs[0].token_id == refs[0].token_id
    assert abs(outs[0].logprob.logprob - refs[0].logprob.logprob) < 0.05
    # the pool holds real values (stored, dequantized on read), not zeros
    assert engine.runner.kv_cache.buffer.float().abs().sum() > 0


def test_fp8_kv_cache_is_refused_by_a_backend_that_does_not_declare_it():
    from minisgl_core.api import AttentionBackend
    from minisgl_core.runner.model_runner import check_kv_dtype

    class NoFp8(AttentionBackend):
        capabilities = frozenset({"prefill", "decode"})

    torch_backend = Plugins.load().resolve("attention", "torch")
    check_kv_dtype("fp8_e4m3", torch.float8_e4m3fn, torch.bfloat16, {"torch": torch_backend})
    with pytest.raises(PluginError, match=r"'fa3' does not support --kv-cache-dtype fp8_e4m3"):
        check_kv_dtype(
            "fp8_e4m3", torch.float8_e4m3fn, torch.bfloat16, {"fa3": NoFp8, "torch": torch_backend}
        )


def test_the_flags_reach_the_engine_config(tiny_model_dir):
    from minisgl_core.config_args import add_engine_args, engine_config_from_args

    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    args = parser.parse_args(
        ["--model", str(tiny_model_dir), "--quantization", "int8", "--kv-cache-dtype", "fp8_e4m3"]
    )
    config = engine_config_from_args(args)
    assert (config.quantization, config.kv_cache_dtype) == ("int8", "fp8_e4m3")
    assert config.resolve_kv_dtype(torch.bfloat16) == torch.float8_e4m3fn
    assert EngineConfig(model="m").resolve_kv_dtype(torch.bfloat16) == torch.bfloat16
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of auto, fp8_e4m3"):
        EngineConfig(model="m", kv_cache_dtype="fp8")
