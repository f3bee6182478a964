"""Programmatic dependent launch in the small decode graphs (``cuda_graph.PDL_MAX_BS``, CUDA only):
with ``MINISGL_PDL`` unset the graphs of up to that many sequences are captured inside
``pdl_scope(True)`` and the larger ones outside it, and greedy output is the same tokens as with
``MINISGL_PDL=0`` (PDL moves when kernels start, not what they compute)."""

from __future__ import annotations

import contextlib

import pytest
import torch

from minisgl_core import SamplingParams
from minisgl_core.demo.factories import make_model_dir

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _generate(model_dir, prompts):
    from minisgl_core.llm import LLM

    llm = LLM(
        model_dir, device="cuda", dtype="bfloat16", attn="torch,triton", page_size=16, num_kv_tokens=65536,
        cuda_graph_max_bs=32,
    )  # fmt: skip
    try:
        params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
        # one, three and eleven sequences a step: graphs of 1, 4 (with PDL) and 16 (without)
        return [[o.token_ids for o in llm.generate(prompts[:n], params, use_tqdm=False)] for n in (1, 3, 11)]
    finally:
        llm.close()


def test_small_decode_graphs_take_pdl_and_answer_the_same(tmp_path, monkeypatch):
    import minisgl_core.runner.cuda_graph as cuda_graph

    model_dir = make_model_dir(tmp_path / "q", "Qwen3ForCausalLM", max_position_embeddings=1024)
    prompts = [[3 + i, 9, 27, 81 % (i + 2), 5 * i % 97] for i in range(11)]
    scopes: dict[int, bool] = {}
    real_scope = cuda_graph.pdl_scope
    captured_bs: list[int] = []
    real_batch = cuda_graph.GraphRunner._batch

    def recording_batch(self, bs, seq_lens_cpu, shared=None):
        captured_bs.append(bs)
        return real_batch(self, bs, seq_lens_cpu, shared)

    @contextlib.contextmanager
    def recording_scope(enabled):
        scopes[captured_bs[-1]] = enabled
        with real_scope(enabled):
            yield

    monkeypatch.delenv("MINISGL_PDL", raising=False)
    monkeypatch.setattr(cuda_graph, "pdl_scope", recording_scope)
    monkeypatch.setattr(cuda_graph.GraphRunner, "_batch", recording_batch)
    with_pdl = _generate(model_dir, prompts)
    assert scopes and all(on == (bs <= cuda_graph.PDL_MAX_BS) for bs, on in scopes.items()), scopes
    assert any(on for on in scopes.values()) and not all(scopes.values()), scopes
    monkeypatch.setenv("MINISGL_PDL", "0")
    assert _generate(model_dir, prompts) == with_pdl
