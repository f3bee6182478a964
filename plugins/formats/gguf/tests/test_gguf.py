"""GGUF files of every supported tensor type against transformers' own GGUF loading, and bad files.

Tiny random llama / qwen2 / qwen3 / phi3 / qwen3moe / gemma / gemma2 / gemma3 models are written with ``gguf.GGUFWriter``; the tensor types
``gguf.quants`` cannot quantize (the K-quants and i-quants) are filled with random blocks of small scales.
Our model loaded through :class:`GGUFFormat` must give transformers' logits for the same file.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from minisgl_plugin_gguf.format import SUPPORTED_TYPES, GGUFFormat
from minisgl_plugin_gguf.metadata import hf_config_from_metadata
from minisgl_plugin_gguf.writer import write_gguf

from minisgl_core.testing.cli_runner import run_cli
from minisgl_core.testing.harness import greedy_generate, make_attention
from minisgl_core.testing.reference import TransformersReference, assert_logits_close, random_prompt

pytest_plugins = ["minisgl_core.testing.pytest_plugin"]

#: row length a multiple of 256, so the K-quants (256-weight super-blocks) apply to every matrix
K_FRIENDLY = dict(
    hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2, head_dim=64
)
#: the types ``gguf.quants`` can quantize (the others are random blocks: :func:`random_blocks`)
QUANTIZABLE = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "TQ1_0", "TQ2_0", "MXFP4")
#: byte offsets of each block's float16 scales (``d``, and ``dmin`` where there is one), by the
#: layouts ``gguf.quants`` reads; IQ1_M spreads its one scale over the top nibbles of its last
#: four 16-bit words (:func:`_set_scales`)
_SCALE_OFFSETS = {
    "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
    "IQ1_S": (0,), "IQ2_XXS": (0,), "IQ2_XS": (0,), "IQ2_S": (0,), "IQ3_XXS": (0,), "IQ3_S": (0,),
    "IQ4_NL": (0,), "IQ4_XS": (0,), "IQ1_M": (),
}  # fmt: skip


def _set_scales(qtype: str, blocks: np.ndarray, scale: np.ndarray) -> None:
    """Every float16 scale of each block (``blocks`` [n, bytes]) set to ``scale`` [n] float16."""
    bits = scale.astype(np.float16).view(np.uint16)
    if qtype == "IQ1_M":  # nibble i of the scale is the top nibble of word i of the last four
        words = blocks[:, -8:].copy().view(np.uint16)
        for i in range(4):
            words[:, i] = (words[:, i] & np.uint16(0x0FFF)) | (
                ((bits >> np.uint16(4 * i)) & np.uint16(0xF)) << np.uint16(12)
            )
        blocks[:, -8:] = words.view(np.uint8)
        return
    for offset in _SCALE_OFFSETS[qtype]:
        blocks[:, offset : offset + 2] = bits.view(np.uint8).reshape(-1, 2)


def random_blocks(qtype: str, seed: int):
    """An ``encode`` hook for :func:`write_gguf`: random ``qtype`` blocks whose scales make the
    dequantized weights' standard deviation about 0.02 (dequantizing is linear in the scales)."""
    import gguf

    quant = gguf.GGMLQuantizationType[qtype]
    block_size, type_size = gguf.GGML_QUANT_SIZES[quant]
    rng = np.random.default_rng(seed)

    def encode(name: str, values: np.ndarray):
        if values.ndim != 2 or values.shape[1] % block_size:
            return None  # norms stay float32, as llama.cpp keeps them
        rows, cols = values.shape
        blocks = rng.integers(0, 256, size=(rows * cols // block_size, type_size), dtype=np.uint8)
        _set_scales(qtype, blocks, np.ones(len(blocks)))
        spread = float(np.std(gguf.quants.dequantize(blocks, quant)))
        _set_scales(qtype, blocks, np.full(len(blocks), 0.02 / spread) * rng.uniform(0.5, 1.5, len(blocks)))
        return blocks.reshape(rows, cols // block_size * type_size), quant

    return encode


class GGUFReference(TransformersReference):
    """transformers' model of a GGUF file (its own loader dequantizes and un-permutes)."""

    def __init__(self, file: Path) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(
            file.parent, gguf_file=file.name, dtype=torch.float32, attn_implementation="eager"
        ).eval()


def load_ours(file: Path):
    from minisgl_core.api import ModelConfig, ParallelContext
    from minisgl_core.plugins import Plugins

    source = GGUFFormat(file)
    config = source.hf_config()
    model_cls = Plugins.load().resolve("models", config["architectures"][0])
    model = model_cls(ModelConfig(config, torch.float32, torch.device("cpu"), ParallelContext()))
    names = [name for name, _ in source.weights(torch.float32)]
    used = model.load_weights(source.weights(torch.float32))
    assert used == set(names), f"unused tensors: {set(names) - used}"
    return model.eval(), config


def check_against_transformers(file: Path, steps: int = 3) -> None:
    from minisgl_plugin_torch.backend import TorchAttentionBackend

    model, config = load_ours(file)
    prompt = random_prompt(12, config["vocab_size"], seed=5)
    _, logits = greedy_generate(model, make_attention(TorchAttentionBackend, model.kv_spec), prompt, steps)
    _, expected = GGUFReference(file).greedy(prompt, steps)
    for step, (actual, want) in enumerate(zip(logits, expected, strict=True)):
        assert_logits_close(actual, want, 1e-4, what=f"{file.name} logits at step {step}")


@pytest.mark.parametrize(
    "arch", ["LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Phi3ForCausalLM"]
)
@pytest.mark.parametrize("qtype", ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1"])
def test_quantized_model_matches_transformers(make_tiny_model, tmp_path, arch, qtype):
    # transformers' GGUF config for qwen3 ignores qwen3.attention.key_length and keeps Qwen3's
    # head_dim 128 (that of every real Qwen3), so the reference needs that head size
    overrides = {"head_dim": 128} if arch.startswith("Qwen3") else {}
    hf_dir = make_tiny_model(arch, tie_word_embeddings=False, **overrides)
    file = write_gguf(hf_dir, tmp_path / f"{qtype}.gguf", qtype)
    check_against_transformers(file)


@pytest.mark.parametrize("qtype", ["F32", "Q8_0", "Q4_1"])
def test_mixture_of_experts_matches_transformers(make_tiny_model, tmp_path, qtype):
    """qwen3moe: the router (``ffn_gate_inp``) and each expert matrix stacked over the experts
    (``ffn_{gate,up,down}_exps``, 3-D, quantized along their rows), split by the model's loader.
    transformers' GGUF config does not read ``qwen3moe.expert_feed_forward_length`` (it keeps
    Qwen3-30B-A3B's 768), nor key_length (head_dim 128): the reference needs both."""
    hf_dir = make_tiny_model("Qwen3MoeForCausalLM", head_dim=128, moe_intermediate_size=768)
    file = write_gguf(hf_dir, tmp_path / f"moe-{qtype}.gguf", qtype)
    config = GGUFFormat(file).hf_config()
    assert (config["num_experts"], config["num_experts_per_tok"], config["moe_intermediate_size"]) == (
        8,
        2,
        768,
    )
    assert config["norm_topk_prob"] is True  # llama.cpp's qwen3moe always renormalises
    check_against_transformers(file)


def test_mixtral_is_a_llama_file_with_experts(make_tiny_model, tmp_path):
    """llama.cpp writes Mixtral as ``llama`` with ``llama.expert_count`` (experts sized by
    ``feed_forward_length``, q/k rows permuted as Llama's). transformers cannot read such a file,
    so the F32 file is checked against transformers' model of the directory it was written from,
    and every weight of a Q8_0 one against the F32 one's within Q8_0's rounding (a block's largest
    magnitude / 127: a tensor in the wrong place or order is far off)."""
    from minisgl_plugin_torch.backend import TorchAttentionBackend

    from minisgl_core.testing.reference import TransformersReference

    hf_dir = make_tiny_model("MixtralForCausalLM", num_local_experts=4, num_experts_per_tok=2)
    f32 = write_gguf(hf_dir, tmp_path / "mixtral.gguf", "F32")
    model, config = load_ours(f32)
    assert config["architectures"] == ["MixtralForCausalLM"] and config["model_type"] == "llama"
    assert (config["num_local_experts"], config["num_experts_per_tok"], config["intermediate_size"]) == (
        4,
        2,
        32,
    )
    prompt = random_prompt(12, config["vocab_size"], seed=8)
    attention = make_attention(TorchAttentionBackend, model.kv_spec)
    tokens, logits = greedy_generate(model, attention, prompt, 3)
    _, expected = TransformersReference(hf_dir).greedy(prompt, 3)
    for step, (actual, want) in enumerate(zip(logits, expected, strict=True)):
        assert_logits_close(actual, want, 1e-4, what=f"F32 logits at step {step}")
    q8, _ = load_ours(write_gguf(hf_dir, tmp_path / "mixtral-q8.gguf", "Q8_0"))
    exact = dict(model.named_parameters())
    for name, param in q8.named_parameters():
        want = exact[name]
        if param.dim() < 2:  # norms stay float32
            assert torch.equal(param, want), name
            continue
        assert (param - want).abs().max() <= want.abs().max() / 127 + 1e-6, name
        assert not torch.equal(param, want), name  # it was quantized


def test_mixture_of_experts_reads_its_expert_size_from_the_file(make_tiny_model, tmp_path):
    """Experts of another size than 768 (Qwen3-235B-A22B's are 1,536): read from the file, so the
    model from the GGUF computes what transformers computes from the directory it was written from."""
    from minisgl_plugin_torch.backend import TorchAttentionBackend

    from minisgl_core.testing.reference import TransformersReference

    hf_dir = make_tiny_model("Qwen3MoeForCausalLM", moe_intermediate_size=48)
    file = write_gguf(hf_dir, tmp_path / "moe48.gguf", "F32")
    model, config = load_ours(file)
    assert config["moe_intermediate_size"] == 48
    prompt = random_prompt(12, config["vocab_size"], seed=6)
    _, logits = greedy_generate(model, make_attention(TorchAttentionBackend, model.kv_spec), prompt, 3)
    _, expected = TransformersReference(hf_dir).greedy(prompt, 3)
    for step, (actual, want) in enumerate(zip(logits, expected, strict=True)):
        assert_logits_close(actual, want, 1e-4, what=f"logits at step {step}")


@pytest.mark.parametrize("qtype", [*_SCALE_OFFSETS, "Q5_0", "Q5_1", "TQ1_0", "TQ2_0", "MXFP4"])
def test_more_tensor_types_match_transformers(make_tiny_model, tmp_path, qtype):
    """The K-quants and i-quants (random blocks), and the other types ``gguf.quants`` quantizes,
    on a model whose rows are whole 256-weight super-blocks."""
    hf_dir = make_tiny_model("LlamaForCausalLM", tie_word_embeddings=True, **K_FRIENDLY)
    if qtype in QUANTIZABLE:
        file = write_gguf(hf_dir, tmp_path / f"{qtype}.gguf", qtype)
    else:
        file = write_gguf(hf_dir, tmp_path / f"{qtype}.gguf", encode=random_blocks(qtype, seed=1))
    from gguf import GGUFReader

    assert {t.tensor_type.name for t in GGUFReader(file).tensors} == {
        "F32",
        qtype,
    }  # llama.cpp's reader agrees
    check_against_transformers(file)


def test_a_q4_k_m_style_file_of_mixed_types_matches_transformers(make_tiny_model, tmp_path):
    """As llama.cpp writes Q4_K_M for a model whose rows are not whole super-blocks (Qwen2.5-0.5B's
    896 columns): Q5_0 where Q4_K cannot go, Q8_0 where Q6_K cannot, Q4_K and Q6_K elsewhere. Such
    files were refused whole for their Q5_0 tensors."""
    import gguf

    hf_dir = make_tiny_model("Qwen2ForCausalLM", hidden_size=96, head_dim=24, intermediate_size=256)
    k_blocks = {qtype: random_blocks(qtype, seed=2) for qtype in ("Q4_K", "Q6_K")}

    def encode(name: str, values: np.ndarray):
        if values.ndim != 2:
            return None
        wide = values.shape[1] % 256 == 0  # only ffn_down's rows (intermediate_size) are
        qtype = (
            ("Q6_K" if wide else "Q8_0")
            if name in ("blk.0.ffn_down.weight", "token_embd.weight")
            else ("Q4_K" if wide else "Q5_0")
        )
        if wide:
            return k_blocks[qtype](name, values)
        quant = gguf.GGMLQuantizationType[qtype]
        return gguf.quants.quantize(values, quant), quant

    file = write_gguf(hf_dir, tmp_path / "q4_k_m.gguf", encode=encode)
    from gguf import GGUFReader

    types = {t.tensor_type.name for t in GGUFReader(file).tensors}
    assert types == {"F32", "Q4_K", "Q5_0", "Q6_K", "Q8_0"}, types
    check_against_transformers(file)


def _mapped(raw: np.ndarray, qtype: str, dims: tuple[int, ...]):
    """A header and tensor info for ``raw`` bytes of ``qtype`` (ggml ``dims``), read-only as the
    file's map is: what :func:`~minisgl_plugin_gguf.dequantize.dequantize_tensor` reads."""
    import gguf
    from minisgl_plugin_gguf.header import TensorInfo

    data = raw.reshape(-1).copy()
    data.flags.writeable = False

    class Header:
        def tensor_bytes(self, tensor: TensorInfo) -> np.ndarray:
            return data

    info = TensorInfo("t", dims, int(gguf.GGMLQuantizationType[qtype]), 0, data.size)
    return Header(), info


#: float16 scales that are not plain numbers: inf, NaN, a subnormal, -0, -max, a signalling
#: NaN, a negative NaN, -inf, the largest subnormal
_SPECIAL_SCALES = np.array(
    [0x7C00, 0x7E00, 0x0001, 0x8000, 0xFBFF, 0x7C01, 0xFE01, 0xFC00, 0x03FF], dtype=np.uint16
)


#: where each block format keeps its float16 scale ``d`` and, where it has one, its minimum
#: (``m``, ``dmin``): bytes from the block's start
_SCALE_BYTES = {
    "Q8_0": (0, None), "Q4_0": (0, None), "Q4_1": (0, 2),
    "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208, None), "Q2_K": (80, 82), "Q3_K": (108, None),
}  # fmt: skip


@pytest.mark.parametrize("threaded", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("qtype", list(_SCALE_BYTES))
def test_block_formats_dequantize_bitwise_as_gguf_does(qtype, dtype, threaded, monkeypatch):
    """The block formats, a chunk of blocks at a time in PyTorch, against
    ``gguf.quants.dequantize`` (NumPy, a group of rows at a time): random bytes (every bit pattern
    is a valid block, the K-quants' packed scales included), and infinite, NaN, subnormal and
    negative-zero float16 scales planted (and the minimums of Q4_1, Q4_K, Q5_K and Q2_K, alone, in
    the same blocks as such scales, and NaN beside NaN of another payload); float32 equal bit for
    bit, NaN payloads included; bfloat16 and float16 as that float32 cast. Chunks of 32,000
    weights, so a tensor is several and a part; on one thread (a busy CPU) and on PyTorch's."""
    import gguf
    import minisgl_plugin_gguf.dequantize as gguf_dequantize

    monkeypatch.setattr(gguf_dequantize, "_CHUNK_WEIGHTS", 32000)
    monkeypatch.setattr(gguf_dequantize, "free_cores", lambda: 64 if threaded else 1)
    assert qtype in gguf_dequantize._BLOCK_FORMATS
    quant = gguf.GGMLQuantizationType[qtype]
    block, type_size = gguf.GGML_QUANT_SIZES[quant]
    raw = np.random.default_rng(3).integers(0, 256, size=(96, 64 * type_size), dtype=np.uint8)
    blocks = raw.reshape(-1, type_size)
    special = _SPECIAL_SCALES.view(np.uint8).reshape(-1, 2)
    count = len(special)
    d, minimum = _SCALE_BYTES[qtype]
    blocks[:count, d : d + 2] = special
    if minimum is not None:  # the minimums, alone and beside special scales
        blocks[count : 2 * count, minimum : minimum + 2] = special
        blocks[2 * count : 3 * count, d : d + 2] = special
        blocks[2 * count : 3 * count, minimum : minimum + 2] = special[::-1]
        blocks[3 * count : 4 * count, d : d + 2] = special
        blocks[3 * count : 4 * count, minimum : minimum + 2] = np.roll(special, 1, axis=0)
    with np.errstate(invalid="ignore"):
        want = np.asarray(gguf.quants.dequantize(raw, quant), dtype=np.float32)
    assert want.shape == (96, 64 * block) and len(blocks) * block > 6 * 32000
    assert len(blocks) % (32000 // block)  # (a part of a chunk at the end)
    assert np.isnan(want).any() and np.isinf(want).any()
    ours = gguf_dequantize.dequantize_tensor(*_mapped(raw, qtype, (64 * block, 96)), dtype)
    assert ours.dtype == dtype and ours.shape == want.shape
    bits = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}[dtype]
    assert torch.equal(ours.view(bits), torch.from_numpy(want).to(dtype).view(bits))


@pytest.mark.parametrize("qtype", list(_SCALE_BYTES))
def test_one_block_alone_or_ending_a_tensor_dequantizes_as_gguf_does(qtype, monkeypatch):
    """A tensor of one block, and a last chunk of one block: a one-block slice is contiguous at any
    offset, and Q4_0's and Q3_K's packed bytes (at byte 2, in rows of 110 bytes) failed to view as
    int32 words (RuntimeError: storage_offset / stride must be divisible by 4)."""
    import gguf
    import minisgl_plugin_gguf.dequantize as gguf_dequantize

    quant = gguf.GGMLQuantizationType[qtype]
    block, type_size = gguf.GGML_QUANT_SIZES[quant]
    for blocks, chunk in ((1, None), (5, 2 * block), (7, 3 * block)):  # (one block alone, then last)
        if chunk is not None:
            monkeypatch.setattr(gguf_dequantize, "_CHUNK_WEIGHTS", chunk)
        raw = np.random.default_rng(blocks).integers(0, 256, size=(1, blocks * type_size), dtype=np.uint8)
        for at in _SCALE_BYTES[qtype]:  # (finite float16 scales: the test above plants the rest)
            if at is not None:
                raw.reshape(-1, type_size)[:, at + 1] &= 0x3B
        want = np.asarray(gguf.quants.dequantize(raw, quant), dtype=np.float32)
        ours = gguf_dequantize.dequantize_tensor(*_mapped(raw, qtype, (blocks * block, 1)), torch.float32)
        assert torch.equal(ours.view(torch.int32), torch.from_numpy(want).view(torch.int32)), (qtype, blocks)


def test_dequantizing_takes_the_free_cores_only_and_restores_the_setting(monkeypatch):
    """Blocks dequantize on as many of PyTorch's threads as the load average leaves cores free (on
    a busy 2-core CPU two threads made the default model load in seconds: each short step waited
    for a thread off its core); afterwards, and after an error inside, the process has its own
    count again (CPU inference runs on it)."""
    import minisgl_plugin_gguf.dequantize as gguf_dequantize

    monkeypatch.setattr(gguf_dequantize, "_CHUNK_WEIGHTS", 32000)
    seen = []
    chunk = gguf_dequantize._dequantize_chunk
    monkeypatch.setattr(
        gguf_dequantize, "_dequantize_chunk", lambda *a: seen.append(torch.get_num_threads()) or chunk(*a)
    )
    raw = np.random.default_rng(4).integers(0, 256, size=(16, 64 * 18), dtype=np.uint8)  # Q4_0: 18 bytes
    mapped = _mapped(raw, "Q4_0", (64 * 32, 16))  # 1,024 blocks: two chunks
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for free, threads in ((1, 1), (2, 2), (64, 2)):
            seen.clear()
            monkeypatch.setattr(gguf_dequantize, "free_cores", lambda free=free: free)
            gguf_dequantize.dequantize_tensor(*mapped, torch.bfloat16)
            assert seen == [threads, threads] and torch.get_num_threads() == 2, (free, seen)
        monkeypatch.setattr(gguf_dequantize, "free_cores", lambda: 1)
        monkeypatch.setattr(gguf_dequantize, "_dequantize_chunk", lambda *a: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            gguf_dequantize.dequantize_tensor(*mapped, torch.bfloat16)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_free_cores_are_the_cores_less_the_load(monkeypatch):
    import minisgl_plugin_gguf.dequantize as gguf_dequantize

    monkeypatch.setattr(gguf_dequantize.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    for load, free in ((0.2, 4), (1.6, 2), (3.4, 1), (9.0, 1)):
        monkeypatch.setattr(gguf_dequantize.os, "getloadavg", lambda load=load: (load, 0.0, 0.0))
        assert gguf_dequantize.free_cores() == free, load

    def no_load():
        raise OSError("no load average")

    monkeypatch.setattr(gguf_dequantize.os, "getloadavg", no_load)
    assert gguf_dequantize.free_cores() == 4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("qtype", ["F32", "F16", "BF16"])
def test_float_tensors_load_as_gguf_dequantizes_them(qtype, dtype):
    """The stored float types, cast straight to the asked dtype: every float16 and bfloat16 bit
    pattern (a float32 tensor of random bits), against ``gguf.quants.dequantize`` cast; equal bit
    for bit but NaN payloads (PyTorch quiets a signalling NaN, NumPy keeps it; the loader refuses
    a NaN weight anyway)."""
    import gguf
    from minisgl_plugin_gguf.dequantize import dequantize_tensor

    if qtype == "F32":
        raw = np.random.default_rng(4).integers(0, 256, size=(64, 4096), dtype=np.uint8)
    else:
        raw = np.arange(1 << 16, dtype=np.uint16).view(np.uint8).reshape(64, 2048)
    quant = gguf.GGMLQuantizationType[qtype]
    want = torch.from_numpy(np.asarray(gguf.quants.dequantize(raw, quant), dtype=np.float32)).to(dtype)
    ours = dequantize_tensor(*_mapped(raw, qtype, (want.shape[1], 64)), dtype)
    assert ours.dtype == dtype and ours.shape == want.shape
    bits = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}[dtype]
    numbers = ~want.isnan()
    assert torch.equal(ours.isnan(), ~numbers)
    assert torch.equal(ours[numbers].view(bits), want[numbers].view(bits))
    ours.add_(1)  # a tensor of its own: the map is read-only


def test_tied_embeddings_when_the_file_has_no_output_tensor(make_tiny_model, tmp_path):
    file = write_gguf(make_tiny_model("LlamaForCausalLM", tie_word_embeddings=True), tmp_path / "tied.gguf")
    source = GGUFFormat(file)
    assert source.hf_config()["tie_word_embeddings"] is True
    assert "lm_head.weight" not in dict(source.weights(torch.float32))
    check_against_transformers(file, steps=1)


def test_every_supported_type_is_tested():
    tested = {*QUANTIZABLE, *_SCALE_OFFSETS}
    assert tested == set(SUPPORTED_TYPES)


def serve_cli(*args: str) -> subprocess.CompletedProcess:
    return run_cli(["serve", "--device", "cpu", *args])


def one_error_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert "Traceback" not in result.stderr, result.stderr
    return lines[-1]


def test_unsupported_architecture_fails_in_one_line(make_tiny_model, tmp_path):
    file = write_gguf(make_tiny_model("LlamaForCausalLM"), tmp_path / "falcon.gguf", arch="falcon")
    with pytest.raises(ValueError, match="architecture 'falcon' is not supported; supported: llama"):
        GGUFFormat(file)
    line = one_error_line(serve_cli("--model", str(file)))
    assert "'falcon' is not supported" in line and "qwen3" in line


def test_unsupported_tensor_type_fails_in_one_line(make_tiny_model, tmp_path):
    import gguf

    def f64(name: str, values: np.ndarray):  # a type no weight is dequantized from
        if name == "blk.0.ffn_up.weight":
            return values.astype(np.float64), gguf.GGMLQuantizationType.F64
        return None

    file = write_gguf(make_tiny_model("LlamaForCausalLM"), tmp_path / "f64.gguf", encode=f64)
    with pytest.raises(ValueError, match=r"blk\.0\.ffn_up\.weight has GGUF type F64.*supported: F32, F16"):
        GGUFFormat(file)
    assert "F64, which is not supported" in one_error_line(serve_cli("--model", str(file)))


def test_truncated_file_fails_before_anything_loads(make_tiny_model, tmp_path):
    from minisgl_core.llm import LLM

    file = write_gguf(make_tiny_model("Qwen3ForCausalLM"), tmp_path / "whole.gguf", "Q8_0")
    data = file.read_bytes()
    cut = tmp_path / "cut" / "model.gguf"
    cut.parent.mkdir()
    for size in (len(data) - 1, len(data) // 2, 40):  # inside the last tensor, mid-weights, mid-header
        cut.write_bytes(data[:size])
        with pytest.raises(ValueError, match="truncated"):
            LLM(cut, device="cpu", attn="torch")
    assert "truncated" in one_error_line(serve_cli("--model", str(cut.parent)))
    # generate and the benches too (a traceback there: they checked the path only)
    generate = run_cli(["generate", "--device", "cpu", "--model", str(cut), "hi"])
    assert "truncated" in one_error_line(generate)


def test_a_dimension_past_the_64_bit_sizes_is_named_not_an_overflow(make_tiny_model, tmp_path):
    # numpy's int64 product of the dimensions wrapped round for 2**63: a size that passed the check
    # against the file's length, then torch's reshape failed with "Overflow when unpacking long long"
    import gguf

    file = write_gguf(make_tiny_model("LlamaForCausalLM"), tmp_path / "dims.gguf")
    reader = gguf.GGUFReader(file, "r+")
    tensor = next(t for t in reader.tensors if t.name == "blk.0.attn_output.weight")
    tensor.field.parts[3][0] = 2**63  # the first dimension
    del reader
    with pytest.raises(ValueError, match=r"tensor blk\.0\.attn_output\.weight ends at byte \d{20,}"):
        GGUFFormat(file)


@pytest.mark.parametrize("field", ["tokenizer.ggml.tokens", "tokenizer.chat_template"])
def test_a_vocabulary_that_is_not_utf8_is_named_not_a_traceback(make_tiny_model, tmp_path, field):
    # transformers' GGUF reader decodes every string strictly: a UnicodeDecodeError traceback from
    # `generate` once the weights had loaded (a byte of the default model's file changed)
    import gguf

    from minisgl_core.checkpoint.formats import ModelPathError
    from minisgl_core.llm import LLM

    file = write_gguf(make_tiny_model("LlamaForCausalLM"), tmp_path / "vocab.gguf")
    reader = gguf.GGUFReader(file, "r+")
    text = reader.fields[field]
    text.parts[text.data[-1]][0] = 0xFF  # the first byte of the last string: never UTF-8
    del reader
    with pytest.raises(ModelPathError, match=r"its tokenizer could not be built .*UnicodeDecodeError"):
        LLM(file, device="cpu", attn="torch")


def test_a_directory_must_hold_exactly_one_gguf(make_tiny_model, tmp_path):
    hf_dir = make_tiny_model("LlamaForCausalLM")
    write_gguf(hf_dir, tmp_path / "a.gguf")
    assert GGUFFormat(tmp_path).file == tmp_path / "a.gguf"
    write_gguf(hf_dir, tmp_path / "b.gguf")
    with pytest.raises(ValueError, match=r"exactly one \.gguf file \(found: a\.gguf, b\.gguf\)"):
        GGUFFormat(tmp_path)


def test_offline_engine_serves_a_gguf_with_its_tokenizer_and_template(make_tiny_model, tmp_path):
    from minisgl_core.llm import LLM
    from minisgl_core.sampling import SamplingParams
    from minisgl_core.tokenizer.load import apply_chat_template, load_tokenizer_dir

    hf_dir = make_tiny_model("Qwen3ForCausalLM")
    file = write_gguf(hf_dir, tmp_path / "tiny.gguf", "F32")
    messages = [{"role": "user", "content": "Hello there"}]
    with (
        LLM(file, device="cpu", attn="torch", num_kv_tokens=1024) as from_gguf,
        LLM(hf_dir, device="cpu", attn="torch", num_kv_tokens=1024) as from_dir,
    ):
        ids = apply_chat_template(from_gguf.tokenizer, messages)
        assert ids == apply_chat_template(load_tokenizer_dir(hf_dir), messages)
        params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
        assert from_gguf.generate([ids], params)[0].token_ids == from_dir.generate([ids], params)[0].token_ids


def test_the_tokenizer_cache_drops_what_no_file_can_use_again(make_tiny_model, tmp_path, monkeypatch):
    """Each GGUF file (each version of it) left a converted tokenizer in the cache directory for
    good: a file deleted or rewritten now takes its entry with it at the next conversion; an entry
    from before the records, and the live file's, stay."""
    import os
    import shutil

    from minisgl_plugin_gguf import format as gguf_format

    monkeypatch.setenv("MINISGL_CACHE_DIR", str(tmp_path / "cache"))
    hf_dir = make_tiny_model("Qwen3ForCausalLM")
    first = write_gguf(hf_dir, tmp_path / "first.gguf", "F32")
    GGUFFormat(first).tokenizer()
    cache = tmp_path / "cache" / "gguf-tokenizers"

    def entries() -> set[str]:
        return {p.name for p in cache.iterdir() if p.is_dir() and not p.name.startswith(".")}

    (old_entry,) = entries()
    assert (cache / old_entry / gguf_format.SOURCE_RECORD).is_file()
    legacy = cache / "legacy0000"  # an entry written before records: kept
    shutil.copytree(cache / old_entry, legacy)
    (legacy / gguf_format.SOURCE_RECORD).unlink()
    second = shutil.copy(first, tmp_path / "second.gguf")
    first.unlink()
    GGUFFormat(Path(second)).tokenizer()
    (second_entry,) = entries() - {"legacy0000"}
    assert second_entry != old_entry and entries() == {second_entry, "legacy0000"}
    assert not (cache / f"{old_entry}.lock").exists()
    os.utime(second, ns=(1, 1))  # rewritten: a new key, the old entry stale
    tokenizer = GGUFFormat(Path(second)).tokenizer()
    assert second_entry not in entries() and len(entries()) == 2
    assert tokenizer.encode("Hello there") == GGUFFormat(Path(second)).tokenizer().encode("Hello there")


LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


def check_against_directory(hf_dir: Path, file: Path, steps: int = 3) -> None:
    """Our model read from ``file`` against transformers' model of the directory it was written
    from (transformers' GGUF loader knows neither rope_freqs nor biases, so it is no reference here)."""
    from minisgl_plugin_torch.backend import TorchAttentionBackend

    model, config = load_ours(file)
    prompt = random_prompt(40, config["vocab_size"], seed=7)  # long enough to reach scaled wavelengths
    _, logits = greedy_generate(model, make_attention(TorchAttentionBackend, model.kv_spec), prompt, steps)
    _, expected = TransformersReference(hf_dir).greedy(prompt, steps)
    for step, (actual, want) in enumerate(zip(logits, expected, strict=True)):
        assert_logits_close(actual, want, 1e-4, what=f"{file.name} logits at step {step}")


@pytest.mark.parametrize(
    "scaling", [LLAMA3_SCALING, {"rope_type": "linear", "factor": 4.0}], ids=["llama3", "linear"]
)
def test_rope_scaling_is_read_from_the_file(make_tiny_model, tmp_path, scaling):
    # llama.cpp stores Llama 3.1's scaling as a rope_freqs.weight tensor, linear scaling as
    # metadata; both were dropped (the model computed unscaled rotary angles)
    hf_dir = make_tiny_model("LlamaForCausalLM", rope_theta=500000.0, rope_scaling=scaling)
    file = write_gguf(hf_dir, tmp_path / "scaled.gguf")
    config = GGUFFormat(file).hf_config()
    assert config["rope_scaling"]["rope_type"] == scaling["rope_type"]
    check_against_directory(hf_dir, file)


def test_rope_freqs_of_another_scaling_are_refused(make_tiny_model, tmp_path):
    import gguf

    def odd_factors(name: str, values: np.ndarray):
        if name == "rope_freqs.weight":
            return np.linspace(1.0, 3.0, values.size, dtype=np.float32), gguf.GGMLQuantizationType.F32
        return None

    hf_dir = make_tiny_model("LlamaForCausalLM", rope_scaling=LLAMA3_SCALING)
    file = write_gguf(hf_dir, tmp_path / "odd.gguf", encode=odd_factors)
    with pytest.raises(ValueError, match="not Llama 3's rope scaling"):
        GGUFFormat(file)
    zeros = write_gguf(hf_dir, tmp_path / "zeros.gguf", encode=lambda name, values: (
        (np.zeros_like(values), gguf.GGMLQuantizationType.F32) if name == "rope_freqs.weight" else None
    ))  # fmt: skip
    with pytest.raises(ValueError, match="not Llama 3's rope scaling"):  # a fit with factor 0 once
        GGUFFormat(zeros)


@pytest.mark.parametrize(
    "arch, flags",
    [
        ("LlamaForCausalLM", {"attention_bias": True, "mlp_bias": True}),
        ("Qwen3ForCausalLM", {"attention_bias": True}),
        ("Qwen2ForCausalLM", {}),
    ],
)
def test_bias_tensors_are_loaded(make_tiny_model, tmp_path, arch, flags):
    # the config built from the metadata had no bias flags: biases were left out with a warning.
    # Qwen2's q, k and v biases are the model's own: attention_bias would give o_proj one too.
    hf_dir = make_tiny_model(arch, tie_word_embeddings=False, **flags)
    file = write_gguf(hf_dir, tmp_path / "bias.gguf")
    config = GGUFFormat(file).hf_config()
    assert {key: config.get(key) for key in ("attention_bias", "mlp_bias") if key in config} == flags
    check_against_directory(hf_dir, file)


def test_a_gguf_file_is_known_by_its_magic_not_its_name(make_tiny_model, tmp_path):
    from minisgl_core.checkpoint.path_check import check_model_path

    file = write_gguf(make_tiny_model("LlamaForCausalLM"), tmp_path / "model.gguf")
    blob = tmp_path / "sha256-0123abcd"  # how Ollama keeps its GGUF files
    blob.write_bytes(file.read_bytes())
    check_model_path(blob)
    assert GGUFFormat(blob).hf_config()["architectures"] == ["LlamaForCausalLM"]
    pointer = tmp_path / "pointer.gguf"
    pointer.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:00\nsize 12\n")
    with pytest.raises(ValueError, match="Git LFS pointer"):
        check_model_path(pointer)
    text = tmp_path / "notes.gguf"
    text.write_text("not a model")
    with pytest.raises(ValueError, match="not a GGUF file"):
        check_model_path(text)


def _with_fields(
    hf_dir: Path, out: Path, extra_tensors: dict[str, np.ndarray] | None = None, **fields
) -> Path:
    """``hf_dir`` written as GGUF with metadata ``fields`` replaced (None: left out; a tuple:
    the value and its GGUF type), and ``extra_tensors`` added."""
    import gguf

    file = write_gguf(hf_dir, out.with_suffix(".orig.gguf"))
    reader = gguf.GGUFReader(file)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(out), arch)
    for field in reader.fields.values():
        if field.name in fields or field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        writer.add_key_value(field.name, field.contents(), field.types[0], field.types[-1])
    for key, value in fields.items():
        if isinstance(value, tuple):  # (value, its GGUF type): a float64, say
            writer.add_key_value(key, *value)
        elif value is not None:
            writer.add_key_value(key, value, gguf.GGUFValueType.get_type(value))
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, tensor.data, raw_dtype=tensor.tensor_type)
    for name, values in (extra_tensors or {}).items():
        writer.add_tensor(name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"tokenizer.ggml.tokens": None, "tokenizer.ggml.model": None}, "the file has no tokenizer"),
        ({"tokenizer.ggml.eos_token_id": 99999}, "tokenizer.ggml.eos_token_id is 99999, not an id"),
        ({"llama.attention.head_count_kv": 3}, r"blk\.0\.attn_k\.weight has \d+ rows.*head_count_kv \(3\)"),
        ({"split.count": 2, "split.no": 0}, "part 1 of a GGUF split into 2 files"),
        # a llama file with experts is Mixtral: this one's metadata claims experts its tensors lack
        (
            {"llama.expert_count": 4},
            r"model parameter 'model\.layers\.0\.mlp\.gate\.weight' was never loaded",
        ),
        ({"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": 4.0}, "'yarn' is not supported"),
        (
            {"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 0.5},
            r"llama\.rope\.scaling\.factor must be a number of at least 1 \(the positions are divided by it\), "
            "got 0.5",
        ),
    ],
    ids=["no-tokenizer", "eos-out-of-range", "kv-heads", "split", "experts", "yarn", "factor-below-1"],
)
def test_files_our_models_cannot_serve_fail_in_one_line(make_tiny_model, tmp_path, fields, message):
    # each was a traceback from transformers, a reshape or a worker, or loaded and ran wrong
    file = _with_fields(make_tiny_model("LlamaForCausalLM"), tmp_path / "bad.gguf", **fields)
    generate = run_cli(["generate", "--device", "cpu", "--model", str(file), "hi"])
    assert re.search(message, one_error_line(generate))


@pytest.mark.parametrize(
    "fields, message",
    [
        # the model's tables are sized by the metadata: each asked the allocator for 512 GB (a
        # bare RuntimeError; on a machine that overcommits, the OOM killer), now named up front
        (
            {"llama.feed_forward_length": 2_000_000_000},
            r"blk\.0\.ffn_down\.weight has 128 columns, the metadata's llama\.feed_forward_length makes 2000000000",
        ),
        (
            {"llama.vocab_size": 2_000_000_000},
            r"(output|token_embd)\.weight has 1024 rows, the metadata's llama\.vocab_size .* makes 2000000000",
        ),
        # transformers' tokenizer indexed the token list with it: an IndexError
        ({"tokenizer.ggml.padding_token_id": 99999}, "tokenizer.ggml.padding_token_id is 99999, not an id"),
        # the rotary share of a head of size 0: a ZeroDivisionError
        (
            {
                "llama.embedding_length": 0,
                "llama.rope.dimension_count": 16,
                "llama.attention.key_length": None,
            },
            r"llama\.embedding_length must be a positive integer, got 0",
        ),
        # range(2_000_000_000) as a set, to find which blk.N the weights lack: a MemoryError
        ({"llama.block_count": 2_000_000_000}, r"block_count 2000000000, the weights have no blk\.2\.\*"),
    ],
    ids=["ffn-size", "vocab-size", "pad-id", "no-hidden-size", "block-count"],
)
def test_metadata_that_sizes_the_model_past_its_weights_is_named(make_tiny_model, tmp_path, fields, message):
    from minisgl_core.llm import LLM

    file = _with_fields(make_tiny_model("LlamaForCausalLM"), tmp_path / "bad.gguf", **fields)
    with pytest.raises(ValueError, match=message):
        LLM(file, device="cpu", attn="torch")


F64 = "FLOAT64"
THETA_SAYS = "must be a number above 1 (the rotary base; models use 10000 to 1e9), got "
EPS_SAYS = "must be a number between 0 and 1 (the norm's epsilon; models use 1e-5 or 1e-6), got "


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        *(("llama.rope.freq_base", value, THETA_SAYS) for value in (0.0, -1.0, 0.5, 1.0, float("inf"))),
        ("llama.rope.freq_base", (1e-320, F64), THETA_SAYS),
        ("llama.rope.freq_base", float("nan"), THETA_SAYS),
        ("llama.rope.freq_base", "10000", THETA_SAYS),
        *(("llama.attention.layer_norm_rms_epsilon", value, EPS_SAYS) for value in (0.0, -1.0, 1.0, 7.0)),
        ("llama.attention.layer_norm_rms_epsilon", (1e308, F64), EPS_SAYS),
        ("llama.attention.layer_norm_rms_epsilon", float("nan"), EPS_SAYS),
        ("llama.attention.layer_norm_rms_epsilon", float("-inf"), EPS_SAYS),
        # (a count as a string was a TypeError traceback, or int()'s silent 7; 4.0 a float)
        ("llama.expert_count", "7", "must be a whole number (0: none), got "),
        ("llama.vocab_size", "1024", "must be a positive integer, got "),
        ("llama.attention.head_count", (4.0, "FLOAT32"), "must be a positive integer, got "),
        ("llama.block_count", True, "must be a positive integer, got "),
    ],
    ids=lambda value: json.dumps(value if not isinstance(value, tuple) else value[0])[:16],
)
def test_metadata_numbers_that_cannot_be_right_are_named_in_the_files_keys(
    make_tiny_model, tmp_path, key, value, says
):
    """A probe's find: a rotary base of 0.5 or 1e-320 (an infinity) and a norm epsilon of 1e308 or 7
    loaded a model that answered nonsense; -1 or NaN was refused only by a scheduler process once
    the workers had started (exit code 1, blaming "the file's metadata: rope_theta"). Now one line
    naming the file and its key, as config.json's rope_theta and rms_norm_eps are refused."""
    import gguf

    if isinstance(value, tuple):
        value = (value[0], getattr(gguf.GGUFValueType, value[1]))
    file = _with_fields(make_tiny_model("LlamaForCausalLM"), tmp_path / "bad.gguf", **{key: value})
    line = f"{file}: {key} {says}{json.dumps(value[0] if isinstance(value, tuple) else value)}"
    with pytest.raises(ValueError) as err:
        GGUFFormat(file)
    assert str(err.value) == line
    assert one_error_line(serve_cli("--model", str(file))) == f"minisgl: error: {line}"


def test_an_expert_count_of_zero_is_a_dense_model(make_tiny_model, tmp_path):
    """llama.cpp reads ``expert_count`` 0 as no experts (dense files may state it): no experts in the
    config, which the core would refuse as a count below 1."""
    file = _with_fields(
        make_tiny_model("LlamaForCausalLM"),
        tmp_path / "dense.gguf",
        **{"llama.expert_count": 0, "llama.expert_used_count": 0},
    )
    from minisgl_core.llm import LLM

    config = GGUFFormat(file).hf_config()
    assert config["architectures"] == ["LlamaForCausalLM"] and "num_experts" not in config
    assert "num_experts_per_tok" not in config
    with LLM(file, device="cpu", attn="torch", num_kv_tokens=512) as llm:
        output = llm.generate([[5, 6, 7]], llm.sampling_params(temperature=0, max_tokens=2))[0]
    assert len(output.token_ids) == 2


def test_no_experts_used_beside_experts_is_refused(make_tiny_model, tmp_path):
    """A probe's find: qwen3moe.expert_used_count 0 was left out with the dense files' zeros, and
    the model ran its default of 8 experts a token without a word."""
    from minisgl_core.llm import LLM

    file = _with_fields(
        make_tiny_model("Qwen3MoeForCausalLM"),
        tmp_path / "none-used.gguf",
        **{"qwen3moe.expert_used_count": 0},
    )
    assert GGUFFormat(file).hf_config()["num_experts_per_tok"] == 0
    with pytest.raises(ValueError) as err:
        LLM(file, device="cpu", attn="torch")
    assert str(err.value).endswith("num_experts_per_tok must be a positive integer, got 0")


def test_experts_in_an_architecture_without_them_are_refused(make_tiny_model, tmp_path):
    file = _with_fields(
        make_tiny_model("Qwen3ForCausalLM"), tmp_path / "bad.gguf", **{"qwen3.expert_count": 4}
    )
    generate = run_cli(["generate", "--device", "cpu", "--model", str(file), "hi"])
    assert re.search(
        r"a mixture-of-experts model \(qwen3\.expert_count = 4\), which is not supported",
        one_error_line(generate),
    )


def test_an_alignment_of_zero_is_named(make_tiny_model, tmp_path):
    file = _with_fields(
        make_tiny_model("LlamaForCausalLM"), tmp_path / "align.gguf", **{"general.alignment": 0}
    )
    with pytest.raises(ValueError, match="general.alignment is 0, not a positive multiple of 8"):
        GGUFFormat(file)


def _with_data_offset(file: Path, out: Path, name: str, offset: int) -> Path:
    """``file`` with tensor ``name``'s data offset (relative to the data section) set to ``offset``."""
    import gguf

    tensor = next(t for t in gguf.GGUFReader(file).tensors if t.name == name)
    data = bytearray(file.read_bytes())
    # the offset is the last field of the tensor's info
    position = tensor.field.offset + sum(part.nbytes for part in tensor.field.parts[:-1])
    data[position : position + 8] = offset.to_bytes(8, "little")
    out.write_bytes(data)
    return out


def test_tensor_data_that_overlaps_or_is_misaligned_is_refused(make_tiny_model, tmp_path):
    # llama.cpp refuses both; they loaded other bytes as the weights and generated garbage
    import gguf

    file = write_gguf(make_tiny_model("LlamaForCausalLM"), tmp_path / "good.gguf", "Q8_0")
    tensors = gguf.GGUFReader(file).tensors
    offsets = {t.name: t.field.parts[-1][0].item() for t in tensors}
    down_bytes = next(t.n_bytes for t in tensors if t.name == "blk.0.ffn_down.weight")
    overlap = _with_data_offset(
        file, tmp_path / "overlap.gguf", "blk.1.ffn_down.weight", offsets["blk.0.ffn_down.weight"]
    )
    line = one_error_line(run_cli(["generate", "--device", "cpu", "--model", str(overlap), "hi"]))
    assert line.endswith(
        f"{overlap} is not a readable GGUF file: tensor blk.1.ffn_down.weight (data offset "
        f"{offsets['blk.0.ffn_down.weight']}) overlaps tensor blk.0.ffn_down.weight (data offset "
        f"{offsets['blk.0.ffn_down.weight']}, {down_bytes} bytes)"
    ), line
    misaligned = _with_data_offset(
        file, tmp_path / "misaligned.gguf", "blk.1.attn_q.weight", offsets["blk.1.attn_q.weight"] + 16
    )
    with pytest.raises(ValueError) as err:
        GGUFFormat(misaligned)
    assert str(err.value) == (
        f"{misaligned} is not a readable GGUF file: tensor blk.1.attn_q.weight has data offset "
        f"{offsets['blk.1.attn_q.weight'] + 16}, not a multiple of general.alignment (32)"
    )


@pytest.mark.parametrize(
    "fields, extra, says",
    [
        ({"llama.block_count": 1}, None, "llama.block_count 1, the weights also hold blk.1.* (2 layers in all)"),
        ({}, "blk.5.attn_norm.weight", "llama.block_count 2, the weights also hold blk.5.* (3 layers in all)"),
        ({"llama.block_count": 3}, None, "llama.block_count 3, the weights have no blk.2.* (they hold 2 layers)"),
    ],
    ids=["fewer", "stray-block", "more"],
)  # fmt: skip
def test_a_block_count_that_does_not_count_the_blocks_is_refused(
    make_tiny_model, tmp_path, fields, extra, says
):
    # a smaller count loaded the first blocks only, without a word (config.json's num_hidden_layers is checked)
    extra_tensors = {extra: np.ones(64, dtype=np.float32)} if extra else None
    file = _with_fields(make_tiny_model("LlamaForCausalLM"), tmp_path / "bad.gguf", extra_tensors, **fields)
    message = f"{file}: the metadata says {says}: the metadata does not describe these weights"
    with pytest.raises(ValueError) as err:
        GGUFFormat(file)
    assert str(err.value) == message
    if fields.get("llama.block_count") == 1:
        line = one_error_line(run_cli(["generate", "--device", "cpu", "--model", str(file), "hi"]))
        assert line.endswith(message), line


def test_phi3_windows_load_and_longrope_is_refused_in_one_line(make_tiny_model, tmp_path):
    """Phi-3-mini-4k's window (llama.cpp writes phi3.attention.sliding_window) reaches the model's
    config, whose attention applies it (API 2.7), and the 128k models' longrope factors
    (rope_factors_long/short tensors) are refused: rotary angles without them would be other
    numbers. A window of the whole context loads too."""

    windowed = write_gguf(make_tiny_model("Phi3ForCausalLM", sliding_window=64), tmp_path / "w.gguf")
    assert GGUFFormat(windowed).hf_config()["sliding_window"] == 64
    generate = run_cli(["generate", "--device", "cpu", "--model", str(windowed), "--max-tokens", "2", "hi"])
    assert generate.returncode == 0, generate.stderr
    whole = write_gguf(make_tiny_model("Phi3ForCausalLM", sliding_window=2048), tmp_path / "whole.gguf")
    assert GGUFFormat(whole).hf_config()["sliding_window"] == 2048
    check_against_transformers(whole, steps=2)

    factors = {
        name: np.ones(8, dtype=np.float32)
        for name in ("rope_factors_long.weight", "rope_factors_short.weight")
    }
    _with_fields(make_tiny_model("Phi3ForCausalLM"), tmp_path / "with-factors.gguf", extra_tensors=factors)
    generate = run_cli(["generate", "--device", "cpu", "--model", str(tmp_path / "with-factors.gguf"), "hi"])
    assert "rope type 'longrope' is not supported" in one_error_line(generate)


@pytest.mark.parametrize("key_length", [True, False], ids=["key_length", "no_key_length"])
def test_a_rotary_part_of_each_head_is_passed_on_with_or_without_key_length(key_length):
    """llama.cpp writes Llama files without attention.key_length: a rope.dimension_count of part
    of the head was then ignored, and the model rotated whole heads, computing other numbers."""
    from minisgl_plugin_gguf.metadata import hf_config_from_metadata

    fields = {
        "general.architecture": "llama", "llama.embedding_length": 64, "llama.block_count": 1,
        "llama.attention.head_count": 4, "llama.vocab_size": 100, "llama.rope.dimension_count": 8,
    }  # fmt: skip
    if key_length:
        fields["llama.attention.key_length"] = 16
    config = hf_config_from_metadata(fields, tied=True, path="x.gguf")
    assert config["partial_rotary_factor"] == 0.5
    fields["llama.rope.dimension_count"] = 16  # the whole head: nothing to pass on
    assert "partial_rotary_factor" not in hf_config_from_metadata(fields, tied=True, path="x.gguf")


def _set_dims(file: Path, name: str, dims: tuple[int, ...]) -> None:
    """Rewrite tensor ``name``'s dims (ggml order) in the header of ``file``, in place."""
    import struct

    data = bytearray(file.read_bytes())
    key = name.encode()
    at = data.index(struct.pack("<Q", len(key)) + key) + 8 + len(key)  # its n_dims, then the dims
    assert struct.unpack_from("<I", data, at)[0] == len(dims)
    struct.pack_into(f"<{len(dims)}Q", data, at + 4, *dims)
    file.write_bytes(bytes(data))


def test_rows_that_are_not_whole_blocks_fail_at_open_naming_the_tensor(make_tiny_model, tmp_path):
    """The header's size check rounds down (elements // block * bytes), so Q8_0 rows of 16 values
    opened; the load then failed on a reshape blamed on the tensor before this one (a probe's find)."""
    file = write_gguf(make_tiny_model("LlamaForCausalLM"), tmp_path / "q8.gguf", qtype="Q8_0")
    GGUFFormat(file)  # as written: whole blocks
    rows, width = next(t.dims for t in GGUFFormat(file).header.tensors if t.name == "blk.0.ffn_up.weight")
    _set_dims(file, "blk.0.ffn_up.weight", (16, rows * width // 16))  # as many values, rows of 16
    with pytest.raises(ValueError, match=r"tensor blk\.0\.ffn_up\.weight has GGUF type Q8_0 with rows of 16 "
                       r"values, not whole blocks of 32: the file is damaged"):  # fmt: skip
        GGUFFormat(file)


def test_a_big_endian_file_is_named_as_such(tmp_path):
    """Its version read little-endian was "GGUF version 50331648 is not supported (2 and 3 are)"."""
    file = tmp_path / "be.gguf"
    file.write_bytes(b"GGUF" + (3).to_bytes(4, "big") + bytes(16))
    with pytest.raises(ValueError, match="the file is big-endian .*its version reads 50331648"):
        GGUFFormat(file)


# --- Gemma, Gemma 2 and Gemma 3 -------------------------------------------------------------------
# Files as llama.cpp's converter writes them (``write_gguf``: norm weights plus one, Gemma 2's four
# norms a block, no rope base for Gemma 1 and 2, the soft-caps and the window in metadata, no
# ``output.weight`` for Gemma 1 and 2), read into the gemma plugin's models and compared with
# transformers' model of the directory they were written from.

#: tiny shapes each of whose settings changes the logits: small soft-caps, an 8-token window under
#: the 40-token prompt, a query_pre_attn_scalar of head_dim (llama.cpp's rule below 27B); Gemma 3
#: with 7 blocks, so llama.cpp's period of 6 gives both kinds of layer (block 5 attends fully)
GEMMA_SHAPES = {
    "GemmaForCausalLM": dict(),
    "Gemma2ForCausalLM": dict(
        num_hidden_layers=3, query_pre_attn_scalar=16, attn_logit_softcapping=2.0,
        final_logit_softcapping=3.0, sliding_window=8,
    ),
    "Gemma3ForCausalLM": dict(
        num_hidden_layers=7, sliding_window=8, final_logit_softcapping=3.0, query_pre_attn_scalar=16,
        tie_word_embeddings=False,
    ),
}  # fmt: skip


@pytest.mark.parametrize("arch", list(GEMMA_SHAPES))
@pytest.mark.parametrize("qtype", ["F32", "Q8_0"])
def test_gemma_files_match_transformers(make_tiny_model, tmp_path, arch, qtype):
    hf_dir = make_tiny_model(arch, **GEMMA_SHAPES[arch])
    file = write_gguf(hf_dir, tmp_path / f"{arch}-{qtype}.gguf", qtype)
    config = GGUFFormat(file).hf_config()
    assert config["architectures"] == [arch]
    if qtype == "F32":
        check_against_directory(hf_dir, file)
        return
    # quantized: transformers' model of the directory with its matrices replaced by the file's
    # dequantized ones; its norms (F32 in the file, as llama.cpp keeps them) stay the checkpoint's,
    # so the +1 is still checked against the original
    expected = TransformersReference(hf_dir)
    model_state = expected.model.state_dict()
    for name, tensor in GGUFFormat(file).weights(torch.float32):
        if tensor.ndim == 2:
            model_state[name].copy_(tensor)
            if name == "model.embed_tokens.weight" and config["tie_word_embeddings"]:
                model_state["lm_head.weight"].copy_(tensor)
    _check_with_reference(file, expected)


def _check_with_reference(file: Path, reference: TransformersReference) -> None:
    from minisgl_plugin_torch.backend import TorchAttentionBackend

    model, config = load_ours(file)
    prompt = random_prompt(40, config["vocab_size"], seed=7)
    _, logits = greedy_generate(model, make_attention(TorchAttentionBackend, model.kv_spec), prompt, 3)
    _, expected = reference.greedy(prompt, 3)
    for step, (actual, want) in enumerate(zip(logits, expected, strict=True)):
        assert_logits_close(actual, want, 1e-4, what=f"{file.name} logits at step {step}")


def test_norm_weights_are_read_back_without_the_plus_one(make_tiny_model, tmp_path):
    """Every norm (Gemma 3's per-head q/k norms too) is the checkpoint's, around zero."""
    from safetensors.torch import load_file

    hf_dir = make_tiny_model("Gemma3ForCausalLM", **GEMMA_SHAPES["Gemma3ForCausalLM"])
    file = write_gguf(hf_dir, tmp_path / "g3.gguf")
    ours = dict(GGUFFormat(file).weights(torch.float32))
    theirs = {k: v for path in hf_dir.glob("*.safetensors") for k, v in load_file(path).items()}
    norms = [name for name in theirs if name.endswith("norm.weight")]
    assert any("q_norm" in name for name in norms) and any("post_feedforward" in name for name in norms)
    assert "lm_head.weight" in ours  # (Gemma 3 files keep an untied head: Gemma3Model skips nothing)
    for name in norms:
        # (the +1 and -1 in float32 round the weight to a multiple of 2**-23 at most: not bitwise)
        torch.testing.assert_close(ours[name], theirs[name].float(), rtol=0, atol=2**-23, msg=name)


def _gemma_fields(arch: str, **extra):
    base = {
        "general.architecture": arch,
        f"{arch}.embedding_length": 4608,
        f"{arch}.attention.head_count": 32,
        f"{arch}.attention.head_count_kv": 16,
        f"{arch}.attention.key_length": 128,
        "tokenizer.ggml.tokens": ["a", "b"],
    }
    return {**base, **{f"{arch}.{key}": value for key, value in extra.items()}}


@pytest.mark.parametrize(
    ("arch", "layers", "scalar"),
    [("gemma2", 46, 144), ("gemma2", 42, 128), ("gemma3", 62, 144), ("gemma3", 48, 128)],
)
def test_the_attention_scale_follows_llama_cpp_by_layer_count(arch, layers, scalar):
    """query_pre_attn_scalar is not in the file: llama.cpp takes hidden / heads for the 27B models
    (46 Gemma 2 blocks, 62 Gemma 3 ones) and head_dim otherwise."""
    config = hf_config_from_metadata(_gemma_fields(arch, block_count=layers), tied=True, path="x.gguf")
    assert config["query_pre_attn_scalar"] == scalar


def test_llama_cpp_defaults_where_the_file_says_nothing():
    """Gemma 2 without soft-cap or window keys: llama.cpp's 50, 30 and 4096, even layers sliding;
    Gemma 3 without a window: every layer full, no soft-caps, the sliding base 10000 (or the file's);
    Gemma 1 and 2 files have no rope base: 10000."""
    gemma2 = hf_config_from_metadata(_gemma_fields("gemma2", block_count=4), tied=True, path="x.gguf")
    assert (gemma2["attn_logit_softcapping"], gemma2["final_logit_softcapping"]) == (50.0, 30.0)
    assert gemma2["sliding_window"] == 4096 and gemma2["rope_theta"] == 10000.0
    assert gemma2["layer_types"] == ["sliding_attention", "full_attention"] * 2
    gemma3 = hf_config_from_metadata(_gemma_fields("gemma3", block_count=3), tied=True, path="x.gguf")
    assert gemma3["layer_types"] == ["full_attention"] * 3
    assert gemma3["final_logit_softcapping"] is None and gemma3["attn_logit_softcapping"] is None
    assert gemma3["rope_local_base_freq"] == 10000.0
    windowed = hf_config_from_metadata(
        _gemma_fields(
            "gemma3", block_count=7, **{"attention.sliding_window": 512, "rope.freq_base_swa": 20.0}
        ),
        tied=True,
        path="x.gguf",
    )
    assert windowed["layer_types"] == ["sliding_attention"] * 5 + ["full_attention", "sliding_attention"]
    assert windowed["rope_local_base_freq"] == 20.0
    gemma = hf_config_from_metadata(_gemma_fields("gemma", block_count=2), tied=True, path="x.gguf")
    assert gemma["rope_theta"] == 10000.0 and "query_pre_attn_scalar" not in gemma


@pytest.mark.parametrize("arch", ["Gemma2ForCausalLM", "Gemma3ForCausalLM"])
def test_the_engine_runs_a_gemma_file_past_its_window(make_tiny_model, tmp_path, arch):
    """LLM on the .gguf: a 40-token prompt through an 8-token window, the greedy tokens those of
    transformers' model of the directory."""
    from minisgl_core.llm import LLM
    from minisgl_core.sampling import SamplingParams

    hf_dir = make_tiny_model(arch, **GEMMA_SHAPES[arch])
    file = write_gguf(hf_dir, tmp_path / f"{arch}.gguf")
    prompt = [int(t) for t in np.random.default_rng(3).integers(3, 200, size=40)]
    want, _ = TransformersReference(hf_dir).greedy(prompt, 5)  # (the prefill's token and 5 more)
    with LLM(file, device="cpu", attn="torch", num_kv_tokens=1024) as llm:
        params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
        got = llm.generate([prompt], params)[0].token_ids
    assert got == list(want)


def _sentencepiece_gguf(path: Path, arch: str) -> Path:
    """A header-only ``arch`` file with a sentencepiece vocabulary (``tokenizer.ggml.model``
    "llama", as llama.cpp writes Gemma's) and only the embeddings."""
    import gguf

    tokens = ["<pad>", "<eos>", "<bos>", "<unk>", "\u2581", "a", "b", "\u2581a", "ab", "\u2581ab"]
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    writer.add_embedding_length(8)
    writer.add_head_count(2)
    writer.add_head_count_kv(1)
    writer.add_key_length(4)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * len(tokens))
    writer.add_token_types([3, 3, 3, 2] + [1] * (len(tokens) - 4))
    writer.add_bos_token_id(2)
    writer.add_eos_token_id(1)
    writer.add_pad_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_tensor("token_embd.weight", np.zeros((len(tokens), 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("arch", ["gemma", "gemma2", "gemma3"])
def test_gemma_sentencepiece_tokenizers_are_built(tmp_path, monkeypatch, arch):
    """transformers builds Gemma's tokenizer from each file; for ``gemma`` it cannot read the
    config AutoTokenizer needs ("architecture gemma is not supported yet"), so the plugin builds it
    with the class AutoTokenizer picks for gemma2 and gemma3."""
    monkeypatch.setenv("MINISGL_CACHE_DIR", str(tmp_path / "cache"))
    file = _sentencepiece_gguf(tmp_path / f"{arch}.gguf", arch)
    tokenizer = GGUFFormat(file).tokenizer()
    ids = tokenizer.encode("ab a")
    assert tokenizer.convert_ids_to_tokens(ids) == ["<bos>", "ab", "\u2581a"]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "ab a"


def test_gemma3_vocabulary_is_its_embedding_rows(make_tiny_model, tmp_path):
    """llama.cpp's converter cuts Gemma 3's embedding rows past the tokenizer's vocabulary, whatever
    the file's vocab_size says: the model is built with the table's rows."""
    hf_dir = make_tiny_model("Gemma3ForCausalLM", **GEMMA_SHAPES["Gemma3ForCausalLM"])
    rows = GGUFFormat(write_gguf(hf_dir, tmp_path / "g3.gguf")).hf_config()["vocab_size"]
    file = _with_fields(hf_dir, tmp_path / "more.gguf", **{"gemma3.vocab_size": rows + 64})
    assert GGUFFormat(file).hf_config()["vocab_size"] == rows


def test_a_sliding_window_pattern_in_the_file_is_read():
    """Newer llama.cpp reads ``attention.sliding_window_pattern``, a period or a flag a block
    (true: it slides); a list of another length is refused naming the key."""
    window = {"attention.sliding_window": 512}

    def types(pattern):
        fields = _gemma_fields(
            "gemma3", block_count=4, **window, **{"attention.sliding_window_pattern": pattern}
        )
        return hf_config_from_metadata(fields, tied=True, path="x.gguf")["layer_types"]

    assert types(3) == ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]
    assert types([False, True, True, False]) == [
        "full_attention",
        "sliding_attention",
        "sliding_attention",
        "full_attention",
    ]
    with pytest.raises(
        ValueError, match=r"x\.gguf: gemma3\.attention\.sliding_window_pattern has 2 flags for 4"
    ):
        types([True, False])


def test_generation_ends_on_the_files_end_of_turn_token(make_tiny_model, tmp_path):
    """llama.cpp ends generation on the file's end-of-turn (``eot``) and end-of-message tokens as
    on its eos (a Gemma -it file's ``<end_of_turn>`` is not its eos): a tiny model's second greedy
    token named the end of turn ends the reply there, as the eos would."""
    from minisgl_core import LLM, SamplingParams

    hf_dir = make_tiny_model("LlamaForCausalLM")
    plain = write_gguf(hf_dir, tmp_path / "plain.gguf", "F32")
    prompt = random_prompt(12, 100, seed=4)
    free = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    with LLM(plain, device="cpu", attn="torch", num_kv_tokens=1024) as llm:
        tokens = llm.generate([prompt], free)[0].token_ids
    eos = GGUFFormat(plain).generation_config()["eos_token_id"]
    second = next(t for t in tokens[1:] if t != tokens[0] and t != eos)
    file = _with_fields(hf_dir, tmp_path / "eot.gguf", **{"tokenizer.ggml.eot_token_id": second})
    assert GGUFFormat(file).generation_config()["eos_token_id"] == [eos, second]
    stopping = SamplingParams(temperature=0.0, max_tokens=8)
    with LLM(file, device="cpu", attn="torch", num_kv_tokens=1024) as llm:
        out = llm.generate([prompt], stopping)[0]
    assert out.token_ids == tokens[: tokens.index(second) + 1] and out.finish_reason == "stop"


# A tokenizer process's load: transformers without torch (whose GGUF reader then refuses to run).
_TORCH_LESS_LOAD = r"""
import json, sys
from pathlib import Path
from minisgl_core.tokenizer.load import import_transformers_without_torch

import_transformers_without_torch()
from minisgl_plugin_gguf.format import GGUFFormat
try:
    tokenizer = GGUFFormat(Path(sys.argv[1])).tokenizer()
except ValueError as exc:
    print(json.dumps({"error": str(exc), "torch": "torch" in sys.modules}))
else:
    print(json.dumps({"ids": tokenizer.encode(sys.argv[2]), "torch": "torch" in sys.modules}))
"""


@pytest.mark.parametrize("damaged", [False, True])
def test_a_process_without_torch_converts_the_tokenizer_in_the_same_words(
    make_tiny_model, tmp_path, monkeypatch, damaged
):
    """Where transformers runs without torch (the server's tokenizer and detokenizer), the first
    conversion of a file's tokenizer runs in a child interpreter: the same tokenizer, a damaged
    vocabulary refused in the same words, and no torch in the process itself."""
    import gguf

    file = write_gguf(make_tiny_model("LlamaForCausalLM"), tmp_path / "model.gguf")
    if damaged:
        reader = gguf.GGUFReader(file, "r+")
        tokens = reader.fields["tokenizer.ggml.tokens"]
        tokens.parts[tokens.data[-1]][0] = 0xFF  # the first byte of the last string: never UTF-8
        del reader
    text = "hello world, the tokenizer"
    out = subprocess.run(
        [sys.executable, "-c", _TORCH_LESS_LOAD, str(file), text],
        capture_output=True, text=True, timeout=300, check=True,
        env={**os.environ, "MINISGL_CACHE_DIR": str(tmp_path / "torch-less")},
    )  # fmt: skip
    result = json.loads(out.stdout.strip().splitlines()[-1])
    monkeypatch.setenv("MINISGL_CACHE_DIR", str(tmp_path / "here"))
    if damaged:
        with pytest.raises(ValueError) as here:
            GGUFFormat(file).tokenizer()
        assert "UnicodeDecodeError" in str(here.value)
        assert result["error"] == str(here.value)
    else:
        assert result["ids"] == GGUFFormat(file).tokenizer().encode(text)
    assert result["torch"] is False
