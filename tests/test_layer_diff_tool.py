"""``tools/device_layer_diff.py``, the layer-by-layer diagnostic, on the CPU: its comparison counts
a router's flipped choices and the reference's margin at each; its hooks see every layer of a real
engine run, where the float32 reference equals itself and bf16 stays near it."""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from pathlib import Path

import torch

TOOLS = Path(__file__).resolve().parent.parent / "tools"


def load_tool():
    sys.path.insert(0, str(TOOLS))  # the tool imports device_e2e beside it
    try:
        spec = importlib.util.spec_from_file_location("device_layer_diff", TOOLS / "device_layer_diff.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(TOOLS))
    return module


def test_flips_and_their_reference_margins():
    tool = load_tool()
    ref_logits = torch.tensor([[3.0, 2.0, 1.9, 0.0], [3.0, 2.0, 0.5, 0.0], [1.0, 0.9, 0.8, 0.0]])
    # token 0: expert 2 overtakes 1 (reference margin 0.1); token 1: same set, other order;
    # token 2 (the last): 0 drops out for 2 (reference margin 0.1 between the 2nd and 3rd)
    got_logits = torch.tensor([[3.0, 1.8, 1.9, 0.0], [2.0, 3.0, 0.5, 0.0], [0.7, 0.9, 0.8, 0.0]])
    attn = torch.ones(3, 4)
    ref = {"token": 7, "logprob": -1.0,
           "layers": [{"attn": attn, "router_in": attn, "router_logits": ref_logits, "top_k": torch.tensor(2)}]}  # fmt: skip
    run = {"token": 7, "logprob": -1.25,
           "layers": [{"attn": attn * 1.01, "router_in": attn, "router_logits": got_logits, "top_k": torch.tensor(2)}]}  # fmt: skip
    out = tool.compare(run, ref)
    assert out["first_token_same"] and out["first_logprob_diff"] == -0.25
    row = out["layers"][0]
    assert abs(row["attn_rel"] - 0.01) < 1e-6 and row["router_in_rel"] == 0.0
    assert row["router_flips"] == 2 and row["last_token_flipped"]
    assert row["flip_margins"] == [0.1, 0.1]
    assert row["ref_margin_min"] == 0.1


def test_hooks_see_every_layer_of_an_engine_run():
    tool = load_tool()
    from minisgl_core.demo.factories import make_model_dir

    shape = {**tool.SHAPE, **tool.ARCH_SHAPE["MixtralForCausalLM"], "num_hidden_layers": 2}
    shape.update(hidden_size=128, intermediate_size=256, num_attention_heads=4, head_dim=32)
    model_dir = str(
        make_model_dir(tempfile.mkdtemp() + "/m", "MixtralForCausalLM", tokenizer_vocab_size=4096, **shape)
    )
    prompt = tool.e2e_prompts()[4]
    ref = tool.capture(model_dir, prompt, "cpu", "float32", attn="torch")
    assert len(ref["layers"]) == 2
    for layer in ref["layers"]:
        assert layer["attn"].shape == (len(prompt), 128)
        assert layer["router_logits"].shape == (len(prompt), 8) and int(layer["top_k"]) == 2
    again = tool.compare(tool.capture(model_dir, prompt, "cpu", "float32", attn="torch"), ref)
    assert again["first_token_same"] and again["first_logprob_diff"] == 0.0
    assert all(r["attn_rel"] == 0.0 and r["router_flips"] == 0 for r in again["layers"])
    bf16 = tool.compare(tool.capture(model_dir, prompt, "cpu", "bfloat16", attn="torch"), ref)
    # bf16 keeps 8 bits of mantissa: the first layer's attention lands within a few 2^-8 of float32
    assert 0.0 < bf16["layers"][0]["attn_rel"] < 0.02, bf16["layers"][0]
