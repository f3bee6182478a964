"""``--quantization`` and ``--kv-cache-dtype``: a third party's method reached through the hook,
the built-in plugins through the engine, the flags, and the errors for what cannot run."""

from __future__ import annotations

import argparse
import logging
import re
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


@pytest.mark.parametrize("name", ["int8", "fp8"])
def test_int8_and_fp8_quantize_a_mixture_of_experts_experts(make_tiny_model, caplog, name):
    """A MoE block's experts are handed to the method (quantize_experts, API 2.1): int8 / e4m3
    values with a float32 scale an expert row; the routers stay in the run dtype."""
    caplog.set_level(logging.INFO, logger="minisgl_core.runner.quantization")
    engine = engine_for(make_tiny_model("Qwen3MoeForCausalLM"), quantization=name)
    expected = {"int8": torch.int8, "fp8": torch.float8_e4m3fn}[name]
    layers = linear_layers(engine)
    # 2 layers x (qkv, o): both layers' MLPs are mixtures of experts
    assert len(layers) == 4 and all(layer.weight.dtype == expected for layer in layers)
    for layer in engine.runner.model.model.layers:
        experts = layer.mlp.experts
        assert experts.w13.dtype == experts.w2.dtype == expected
        assert experts.w13_scale.shape == experts.w13.shape[:2] and experts.w13_scale.dtype == torch.float32
        assert experts.w2_scale.shape == experts.w2.shape[:2]
        assert layer.mlp.gate.weight.dtype == torch.float32
    assert (
        f"--quantization {name} was handed 4 linear layers and quantized 2 mixture-of-experts blocks' experts"
        in caplog.text
    )
    assert "keep their experts" not in caplog.text
    assert len(greedy(engine, [5, 6, 7, 8])) == 6


def test_a_method_without_quantize_experts_keeps_them_and_says_so(make_tiny_model, caplog):
    """int4 quantizes the linear layers only: the experts stay in the run dtype, which the log
    says (a user expecting the experts quantized would otherwise not know)."""
    engine = engine_for(make_tiny_model("Qwen3MoeForCausalLM"), quantization="int4")
    block = engine.runner.model.model.layers[0].mlp
    assert block.experts.w13.dtype == torch.float32 and block.experts.scales is None
    assert (
        "2 mixture-of-experts blocks keep their experts in float32: --quantization int4 does not "
        "quantize experts" in caplog.text
    )
    assert len(greedy(engine, [5, 6, 7, 8])) == 6


def test_int8_experts_give_what_transformers_gives_with_the_rounded_weights(make_tiny_model, tmp_path):
    """Qwen3-MoE with --quantization int8 (linear layers and experts) against transformers on the
    same checkpoint with every weight the method rounds replaced by its rounded value (int8 times
    its row's scale): the prompt's logprobs agree to float32 precision and greedy decoding gives
    the same tokens."""
    import shutil

    from minisgl_plugin_int8.method import quantize_weight
    from safetensors.torch import load_file, save_file

    from minisgl_core.testing.reference import TransformersReference

    model = make_tiny_model("Qwen3MoeForCausalLM")
    rounded = shutil.copytree(model, tmp_path / "rounded")
    changed = 0
    for path in rounded.glob("*.safetensors"):
        tensors = load_file(path)
        for name, t in tensors.items():
            # attention projections and the experts (per-expert or fused); not embeddings, norms,
            # routers (mlp.gate.weight) or the head
            if re.search(
                r"(self_attn\.[qkvo]_proj|experts\.(\d+\.)?(gate_proj|up_proj|down_proj|gate_up_proj))", name
            ):
                rows = t.reshape(-1, t.shape[-1])
                q, scale = quantize_weight(rows)
                tensors[name] = (q.float() * scale[:, None]).reshape(t.shape).to(t.dtype)
                changed += 1
        save_file(tensors, path)
    assert changed >= 2 * (4 + 2)  # 2 layers: q, k, v, o and the experts (fused or per expert)
    prompt = [5, 17, 300, 42, 9, 77, 120, 3, 64, 250]
    engine = engine_for(model, quantization="int8", dtype="float32")
    engine.add_request(
        0, prompt, SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, prompt_logprobs=1)
    )
    tokens, prompt_logprobs = [], None
    for out in drain(engine):
        if out.token_id >= 0:
            tokens.append(out.token_id)
        if out.prompt_logprobs is not None:
            prompt_logprobs = [lp.logprob for lp in out.prompt_logprobs[1:]]
    reference = TransformersReference(rounded)
    with torch.inference_mode():
        logits = reference.model(input_ids=torch.tensor([prompt])).logits[0].float()
    want = torch.log_softmax(logits, dim=-1)[:-1].gather(1, torch.tensor(prompt[1:])[:, None])[:, 0]
    torch.testing.assert_close(torch.tensor(prompt_logprobs), want, atol=2e-4, rtol=0)
    assert tokens == reference.greedy(prompt, 5)[0]
    assert engine.runner.model.model.layers[0].mlp.experts.w13.dtype == torch.int8


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
