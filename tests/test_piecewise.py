"""Piecewise CUDA graphs of prefill steps (runner/piecewise.py): everything but attention replayed,
the batch padded to a captured token count.

On the CPU: the split at attention sees every layer once, in order, and a body run on a padded
batch (padding at position 0 writing to a dummy slot) with attention on the real rows gives the
eager logits: the arithmetic the graphs replay. On CUDA: the graphs themselves against the eager
forward, batch by batch, and whole generations with them on and off.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from minisgl_core import SamplingParams
from minisgl_core.demo.factories import make_model_dir
from minisgl_core.layers.attention import AttentionLayer, split_at_attention
from minisgl_core.runner.piecewise import supports_piecewise, token_sizes
from minisgl_core.testing.harness import PagedSequences, make_attention
from minisgl_core.testing.policy_suite import resolve
from minisgl_core.testing.reference import assert_logits_close, load_model, random_prompt

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(scope="module", params=["Qwen3ForCausalLM", "LlamaForCausalLM"])
def model_dir(request, tmp_path_factory):
    return make_model_dir(
        tmp_path_factory.mktemp("m") / request.param, request.param, max_position_embeddings=512
    )


def _model(model_dir, dtype=torch.float32, device="cpu"):
    arch = json.loads((model_dir / "config.json").read_text())["architectures"][0]
    model, _ = load_model(resolve("models", arch), model_dir, dtype=dtype, device=device)
    return model


def _sequences(model, backend: str, dtype, device, page_size=1):
    attn = make_attention(
        resolve("attention", backend), model.kv_spec, page_size=page_size, num_pages=1024 // page_size,
        max_requests=8, max_context_len=512, dtype=dtype, device=device,
    )  # fmt: skip
    sequences = PagedSequences(attn, seed=3)
    dummy_page = sequences._free_pages.pop()  # reserved, as the runner reserves its last page
    return attn, sequences, dummy_page * page_size


def _steps(sequences: PagedSequences, vocab: int):
    """Prefill batches an engine makes: one prompt, several, a chunk after a cached prefix, and a
    mixed step (a long chunk with one-token decode rows)."""
    a, b, c = (sequences.new_row() for _ in range(3))
    yield sequences.extend([a], [random_prompt(37, vocab, 1)])
    yield sequences.extend([b, c], [random_prompt(90, vocab, 2), random_prompt(5, vocab, 3)])
    yield sequences.extend([b], [random_prompt(61, vocab, 4)], is_prefill=True)  # after a cached prefix
    yield sequences.extend([a, c, b], [[7], [11], random_prompt(40, vocab, 5)], is_prefill=True)


def test_token_sizes():
    for top in (16, 100, 1024, 2048, 3000):
        sizes = token_sizes(top)
        assert sizes == sorted(set(sizes)) and sizes[-1] == top and sizes[0] <= 16
        assert all(b - a <= 256 for a, b in zip(sizes, sizes[1:]))


def test_decoder_models_opt_in(model_dir):
    model = _model(model_dir)
    assert supports_piecewise(model)


def test_padded_body_with_attention_on_real_rows_equals_eager(model_dir):
    """What a replay computes, without graphs: the body over ``size`` rows (padding tokens at
    position 0 writing to the dummy slot), each attention on the real rows only, its output in a
    zeroed buffer of ``size`` rows; then the head on the real rows."""
    model = _model(model_dir)
    vocab = model.config.hf_config["vocab_size"]
    attn, sequences, dummy = _sequences(model, "torch", torch.float32, "cpu")
    layers = len(model.model.layers)
    with torch.inference_mode():
        for batch in _steps(sequences, vocab):
            expected = model(batch)
            n = batch.num_tokens
            size = next(s for s in token_sizes(256) if s >= n)
            pad = size - n
            padded = dataclasses.replace(
                batch,
                input_ids=torch.cat([batch.input_ids, torch.zeros(pad, dtype=torch.int64)]),
                positions=torch.cat([batch.positions, torch.zeros(pad, dtype=torch.int64)]),
                out_cache_loc=torch.cat([batch.out_cache_loc, torch.full((pad,), dummy)]),
            )
            seen = []

            def split(layer: AttentionLayer, method, args, _padded, n=n, size=size, seen=seen, batch=batch):
                assert all(a.shape[0] == size for a in args), [a.shape for a in args]
                seen.append(layer.layer_id)
                out = torch.zeros(size, layer.num_heads * layer.head_dim)
                with split_at_attention(None):
                    out[:n] = getattr(layer, method)(*(a[:n] for a in args), batch)
                return out

            with split_at_attention(split):
                states = model.hidden_states(padded)
            assert seen == list(range(layers))
            actual = model.logits_from(tuple(s[:n] for s in states), batch)
            assert_logits_close(actual, expected, 1e-5, what=f"{n} tokens padded to {size}")


@cuda
@pytest.mark.parametrize("backend", ["torch", "fi"])
def test_graphs_equal_eager_forward(model_dir, backend):
    """The captured pieces against the eager forward of the same batch, and the KV pool: real
    tokens' slots as eager writes them, padding only in the dummy page."""
    from minisgl_core.runner.piecewise import PiecewiseGraphs

    if backend == "fi":
        pytest.importorskip("flashinfer")
    dtype = torch.bfloat16
    # FlashInfer's prefill kernels take head_dim 64 and up (the small test models have 16)
    arch = json.loads((model_dir / "config.json").read_text())["architectures"][0]
    model_dir = make_model_dir(
        model_dir.parent / f"{arch}-hd64", arch, hidden_size=256, head_dim=64, intermediate_size=512,
        max_position_embeddings=512,
    )  # fmt: skip
    model = _model(model_dir, dtype=dtype, device="cuda")
    vocab = model.config.hf_config["vocab_size"]
    page = 16 if backend == "fi" else 1
    attn, sequences, dummy = _sequences(model, backend, dtype, "cuda", page_size=page)
    graphs = PiecewiseGraphs(model, attn, dummy, 128, torch.device("cuda"))
    assert graphs.sizes[-1] == 128 and len(graphs.pieces[128]) == len(model.model.layers) + 1
    pool = attn.config.kv_cache
    with torch.inference_mode():
        for batch in _steps(sequences, vocab):
            expected = model(batch).float()
            eager_kv = pool.buffer.clone()
            actual = graphs.prepare(batch)().float()
            torch.cuda.synchronize()
            assert_logits_close(actual, expected, 2e-2, what=f"{batch.num_tokens} tokens ({backend})")
            # greedy choices agree wherever the eager top two are apart
            top2 = expected.topk(2, dim=-1).values
            clear = (top2[:, 0] - top2[:, 1]) > 0.05 * top2[:, 0].abs().clamp(min=1)
            assert torch.equal(actual.argmax(-1)[clear], expected.argmax(-1)[clear])
            # [layers, 2, pages, page_size, heads, dim]: every page but the dummy one as eager left it
            # (the same tokens rewritten; padding went to the dummy page only)
            keep = torch.ones(pool.num_pages, dtype=torch.bool, device="cuda")
            keep[dummy // page] = False
            torch.testing.assert_close(
                pool.buffer[:, :, keep].float(), eager_kv[:, :, keep].float(), atol=0.05, rtol=0.02
            )


@cuda
def test_generation_with_and_without_piecewise_graphs(tmp_path):
    """Whole runs through the engine in float32 on CUDA (no TF32): the same greedy tokens with the
    prefill graphs as without, prompts of many lengths, some sharing a prefix, chunked by a small
    prefill budget so chunks after a cached prefix and mixed steps happen."""
    from minisgl_core import LLM

    model_dir = make_model_dir(tmp_path / "q", "Qwen3ForCausalLM", max_position_embeddings=1024)
    vocab = 1024
    prefix = random_prompt(50, vocab, 99)
    prompts = [random_prompt(n, vocab, n) for n in (3, 17, 64, 65, 200, 333, 700)]
    prompts += [prefix + random_prompt(n, vocab, 7 * n) for n in (5, 40)]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    runs = []
    for max_tokens in (512, 0):
        llm = LLM(
            model_dir, device="cuda", dtype="float32", attn="torch", max_prefill_tokens=256,
            mixed_batch=True, piecewise_cuda_graph_max_tokens=max_tokens,
        )  # fmt: skip
        assert (llm.engine.runner.prefill_graphs is not None) == (max_tokens > 0)
        runs.append([o.token_ids for o in llm.generate([list(p) for p in prompts], params, use_tqdm=False)])
        llm.close()
    assert runs[0] == runs[1]
