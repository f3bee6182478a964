"""The CPU speed work (issue 16): the shortcuts taken on a CPU compute what the plain code does,
and `minisgl bench cpu`'s arithmetic (bytes per step, bound, greedy comparison) is right."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minisgl_core import fast_paths
from minisgl_core.api.parallel import ParallelContext
from minisgl_core.bench import cpu as bench_cpu
from minisgl_core.layers import embedding, fused, linear
from minisgl_core.layers.embedding import CPU_SLAB_HEAD_ROWS, ParallelLMHead
from minisgl_core.layers.linear import MergedColumnParallelLinear, RowParallelLinear


def test_lm_head_for_several_rows_equals_f_linear():
    torch.manual_seed(0)
    head = ParallelLMHead(1000, 64, parallel=ParallelContext(), dtype=torch.float32, device="cpu")
    head.weight.data.normal_()
    for rows in (1, 3, 8):
        hidden = torch.randn(rows, 64)
        logits = head(hidden)
        assert logits.shape == (rows, 1000) and logits.is_contiguous()
        torch.testing.assert_close(logits, F.linear(hidden, head.weight), rtol=1e-5, atol=1e-5)
        assert torch.equal(logits.argmax(-1), F.linear(hidden, head.weight).argmax(-1))


def _float64_product(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return (x.double() @ weight.double().T).float()


def test_slab_product_is_as_close_to_float64_as_f_linear_and_serves_only_a_few_float32_rows(monkeypatch):
    """The CPU's slab product (fast path ``cpu_slab_gemm``) computes ``x @ W.T``: within float32's
    worst-case rounding of a 576-term dot product of every output (whatever the order of the sum),
    on average as close to a float64 product as ``F.linear`` is, for any slab count; and it is
    taken only where it was measured to pay (1-4 float32 rows on a CPU, weights whose rows split
    evenly). (The largest error alone compared with ``F.linear``'s flaked: over 30 seeds and 1-2
    threads it reached 5.4 times ``F.linear``'s, while the mean error stayed within 2.5 times.)"""
    torch.manual_seed(0)
    monkeypatch.setattr(linear, "slab_products_pay", lambda: True)
    weight = torch.randn(960, 576)
    unit = 2.0**-24  # float32's unit roundoff
    for rows in (1, 2, 3, 4):
        x = torch.randn(rows, 576)
        want = _float64_product(x, weight)
        # |error| <= K u / (1 - K u) * sum |x_k w_k| (K terms; plus the result's own rounding)
        bound = (576 * unit / (1 - 576 * unit)) * (
            x.abs().double() @ weight.abs().double().T
        ) + unit * want.abs()
        f_linear_mean_error = (F.linear(x, weight) - want).abs().mean()
        for slabs in (2, 3, 4, 8):
            got = linear.slab_matmul(x, weight, slabs)
            assert got.shape == (rows, 960) and got.is_contiguous()
            assert ((got - want).abs().double() <= bound).all()
            assert (got - want).abs().mean() <= 4 * f_linear_mean_error
        # the slab count splits outputs, never a sum: every count gives the same numbers
        assert torch.equal(linear.slab_matmul(x, weight, 2), linear.slab_matmul(x, weight, 8))
    monkeypatch.setattr(torch, "get_num_threads", lambda: 8)
    assert linear.cpu_slabs(torch.randn(1, 576), weight) == 8
    assert linear.cpu_slabs(torch.randn(3, 576), torch.randn(9, 576)) == 3  # 9 rows: 3 slabs of 3
    assert linear.cpu_slabs(torch.randn(1, 576), torch.randn(7, 576)) == 7
    assert linear.cpu_slabs(torch.randn(1, 576), torch.randn(11, 576)) == 0  # prime: F.linear
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    assert linear.cpu_slabs(torch.randn(2, 576), weight) == 2  # one thread: still two slabs
    assert linear.cpu_slabs(torch.randn(4, 576), weight) == 2
    assert linear.cpu_slabs(torch.randn(5, 576), weight) == 0  # five rows: F.linear
    assert linear.cpu_slabs(torch.randn(1, 576).double(), weight.double()) == 0
    assert linear.cpu_slabs(torch.randn(1, 576).bfloat16(), weight.bfloat16()) == 0
    assert linear.cpu_slabs(torch.randn(1, 576), weight.t().contiguous().t()) == 0  # not contiguous
    monkeypatch.setattr(fast_paths, "_configured", fast_paths.FastPaths().without("cpu_slab_gemm"))
    assert linear.cpu_slabs(torch.randn(1, 576), weight) == 0
    monkeypatch.setattr(fast_paths, "_configured", fast_paths.FastPaths())
    monkeypatch.setattr(linear, "slab_products_pay", lambda: False)  # a CPU where F.linear is faster
    assert linear.cpu_slabs(torch.randn(1, 576), weight) == 0


def test_slab_products_are_taken_on_amd_processors_under_mkl_only(tmp_path, monkeypatch):
    """The vendor read from cpuinfo decides (measured: the slabs pay on an AMD EPYC, lose on an
    Intel Xeon), and only with MKL as torch's BLAS; no cpuinfo: no slabs."""
    amd, intel = tmp_path / "amd", tmp_path / "intel"
    amd.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\n")
    intel.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\n")
    assert linear.cpu_vendor(str(amd)) == "AuthenticAMD"
    assert linear.cpu_vendor(str(intel)) == "GenuineIntel"
    assert linear.cpu_vendor(str(tmp_path / "missing")) is None
    real_vendor = linear.cpu_vendor
    for vendor_file, mkl, expected in ((amd, True, True), (intel, True, False), (amd, False, False)):
        linear.slab_products_pay.cache_clear()
        monkeypatch.setattr(linear, "cpu_vendor", lambda path=str(vendor_file): real_vendor(path))
        monkeypatch.setattr(torch.backends.mkl, "is_available", lambda mkl=mkl: mkl)
        assert linear.slab_products_pay() is expected
    linear.slab_products_pay.cache_clear()


def test_onednn_linear_is_as_close_to_float64_as_f_linear_and_serves_float32_cpu_products(monkeypatch):
    """oneDNN's linear (fast path ``cpu_onednn_gemm``) computes ``x @ W.T + b`` within float32's
    worst-case rounding of every output and on average as close to a float64 product as
    ``F.linear`` is, from decode-sized to prefill-sized row counts; and it is taken only for float32
    products on a CPU where MKL is slow, with the switch on. (Its largest error alone compared
    with ``F.linear``'s flaked: over 20 seeds and 1-2 threads it reached 6.5 times it, the mean
    error 3.0 times.)"""
    torch.manual_seed(0)
    monkeypatch.setattr(linear, "slab_products_pay", lambda: True)
    weight, bias = torch.randn(960, 576), torch.randn(960)
    unit = 2.0**-24
    for rows in (1, 5, 8, 33, 300):
        x = torch.randn(rows, 576)
        exact = x.double() @ weight.double().T + bias.double()
        want = exact.float()
        # K + 1 terms (the bias too), then the result's own rounding
        terms = x.abs().double() @ weight.abs().double().T + bias.abs().double()
        bound = (577 * unit / (1 - 577 * unit)) * terms + unit * exact.abs()
        f_linear_mean_error = (F.linear(x, weight, bias) - want).abs().mean()
        assert linear.cpu_onednn(x, weight)
        got = linear.onednn_linear(x, weight, bias)
        assert got.shape == (rows, 960) and got.is_contiguous()
        assert ((got.double() - exact).abs() <= bound).all(), rows
        assert (got - want).abs().mean() <= 5 * f_linear_mean_error, rows
    x = torch.randn(8, 576)
    assert not linear.cpu_onednn(torch.randn(0, 576), weight)
    assert not linear.cpu_onednn(x.double(), weight.double())
    assert not linear.cpu_onednn(x.bfloat16(), weight.bfloat16())
    assert not linear.cpu_onednn(x, weight.t().contiguous().t())  # not contiguous
    assert not linear.cpu_onednn(x[None], weight)  # only 2-D inputs
    monkeypatch.setattr(fast_paths, "_configured", fast_paths.FastPaths().without("cpu_onednn_gemm"))
    assert not linear.cpu_onednn(x, weight)
    monkeypatch.setattr(fast_paths, "_configured", fast_paths.FastPaths())
    monkeypatch.setattr(linear, "slab_products_pay", lambda: False)  # a CPU where F.linear is fast
    assert not linear.cpu_onednn(x, weight)


def test_linear_layers_and_the_head_route_rows_through_slabs_then_onednn(monkeypatch):
    """The layers use the slab product for 1-4 rows and oneDNN's linear from 5 (the head too),
    with the bias added; with oneDNN off the head keeps its slabs up to 32 rows and the layers
    take F.linear; on a CPU where MKL is fast, F.linear throughout. A mutation that drops a slab
    or an output column fails the comparison."""
    torch.manual_seed(0)
    calls = []
    real_slabs, real_onednn = linear.slab_matmul, linear.onednn_linear

    def counting_slabs(x, weight, slabs):
        calls.append(("slabs", x.shape[0], weight.shape[0]))
        return real_slabs(x, weight, slabs)

    def counting_onednn(x, weight, bias=None):
        calls.append(("onednn", x.shape[0], weight.shape[0]))
        return real_onednn(x, weight, bias)

    def pays(value):
        monkeypatch.setattr(linear, "slab_products_pay", lambda: value)
        monkeypatch.setattr("minisgl_core.layers.embedding.slab_products_pay", lambda: value)

    pays(True)
    for module in (linear, embedding):
        monkeypatch.setattr(module, "slab_matmul", counting_slabs)
        monkeypatch.setattr(module, "onednn_linear", counting_onednn)
    up = MergedColumnParallelLinear(
        64, [96, 96], parallel=ParallelContext(), bias=True, dtype=torch.float32, device="cpu"
    )
    down = RowParallelLinear(96, 64, parallel=ParallelContext(), dtype=torch.float32, device="cpu")
    head = ParallelLMHead(1000, 64, parallel=ParallelContext(), dtype=torch.float32, device="cpu")
    for p in (up.weight, up.bias, down.weight, head.weight):
        p.data.normal_()

    def run(rows):
        calls.clear()
        x = torch.randn(rows, 64)
        torch.testing.assert_close(up(x), F.linear(x, up.weight, up.bias), rtol=1e-5, atol=1e-5)
        h = torch.randn(rows, 96)
        torch.testing.assert_close(down(h), F.linear(h, down.weight), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(head(x), F.linear(x, head.weight), rtol=1e-5, atol=1e-5)
        return [c[0] for c in calls], [c[1:] for c in calls]

    for rows in (1, 3, 4, 5, CPU_SLAB_HEAD_ROWS, CPU_SLAB_HEAD_ROWS + 1, 200):
        kind = "slabs" if rows <= linear.CPU_SLAB_ROWS else "onednn"
        assert run(rows) == ([kind] * 3, [(rows, 192), (rows, 64), (rows, 1000)]), rows
    monkeypatch.setattr(fast_paths, "_configured", fast_paths.FastPaths().without("cpu_onednn_gemm"))
    for rows in (4, 5, CPU_SLAB_HEAD_ROWS, CPU_SLAB_HEAD_ROWS + 1):
        slabbed = rows <= linear.CPU_SLAB_ROWS
        expected = [(rows, 192), (rows, 64)] if slabbed else []
        expected += [(rows, 1000)] if rows <= CPU_SLAB_HEAD_ROWS else []
        assert run(rows) == (["slabs"] * len(expected), expected), rows
    monkeypatch.setattr(fast_paths, "_configured", fast_paths.FastPaths())

    def dropping(x, weight, slabs):  # a broken slab product: the last slab's outputs zeroed
        out = real_slabs(x, weight, slabs)
        out[:, -weight.shape[0] // slabs :] = 0
        return out

    def dropping_onednn(x, weight, bias=None):  # a broken oneDNN product: its last column zeroed
        out = real_onednn(x, weight, bias)
        out[:, -1] = 0
        return out

    monkeypatch.setattr(linear, "slab_matmul", dropping)
    monkeypatch.setattr(linear, "onednn_linear", dropping_onednn)
    for rows in (1, 8):
        x = torch.randn(rows, 64)
        assert not torch.allclose(up(x), F.linear(x, up.weight, up.bias)), rows

    # a CPU where MKL is fast: F.linear itself, the head's rows included
    pays(False)
    monkeypatch.setattr(linear, "slab_matmul", counting_slabs)
    monkeypatch.setattr(linear, "onednn_linear", counting_onednn)
    for rows in (1, 3, 8, 64):
        x = torch.randn(rows, 64)
        assert torch.equal(up(x), F.linear(x, up.weight, up.bias))
        assert torch.equal(head(x), F.linear(x, head.weight))
    assert calls == []


def _reference_angles(positions, inv_freq):
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]
    return emb.cos(), emb.sin()


def test_rotary_with_given_angles_equals_computing_them():
    torch.manual_seed(0)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 16, 2).float() / 16))
    positions = torch.tensor([3, 4, 5, 900])
    angles = fused.rotary_angles(positions, inv_freq, torch.float32)
    for got, want in zip(angles, _reference_angles(positions, inv_freq), strict=True):
        torch.testing.assert_close(got, want)
    assert fused.rotary_angles(positions, inv_freq, torch.bfloat16)[0].dtype == torch.bfloat16
    qkv = torch.randn(4, 4 + 2 * 2, 16)
    weights = (torch.rand(16) + 0.5, torch.rand(16) + 0.5)
    given = fused.qkv_norm_rope(qkv, positions, inv_freq, *weights, 4, 2, 1e-6, angles)
    computed = fused.qkv_norm_rope(qkv, positions, inv_freq, *weights, 4, 2, 1e-6)
    assert torch.equal(given, computed)
    # angles of other positions really are used: rotary is not silently recomputing them
    other = fused.rotary_angles(positions + 1, inv_freq, torch.float32)
    assert not torch.allclose(
        fused.qkv_norm_rope(qkv, positions, inv_freq, *weights, 4, 2, 1e-6, other), computed
    )
    q, k = qkv[:, :4], qkv[:, 4:6]
    for a, b in zip(fused.rotary(q, k, positions, inv_freq, angles), fused.rotary(q, k, positions, inv_freq)):
        assert torch.equal(a, b)


def test_a_cpu_forward_computes_the_rotary_angles_once(monkeypatch, tmp_path):
    """Every layer rotates by the angles the decoder computed once for the forward, passed down
    (no memo kept between calls): one computation per forward, whatever the number of layers."""
    from minisgl_core.layers import rotary
    from minisgl_core.sampling import SamplingParams
    from minisgl_core.testing import cpu_llm, make_model_dir

    llm = cpu_llm(make_model_dir(tmp_path / "m", "LlamaForCausalLM", num_hidden_layers=3), cache="naive")
    assert len(llm.engine.runner.model.model.layers) == 3
    params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    expected = llm.generate([[5, 6, 7, 8], [9, 10]], params)
    calls, forwards = [], []
    real_angles, real_prepare = fused.rotary_angles, llm.engine.runner.prepare

    def counting(*args):
        calls.append(args[0].shape)
        return real_angles(*args)

    def counting_prepare(batch):  # the engine prepares each forward, then runs it
        forwards.append(batch)
        return real_prepare(batch)

    # both names the angles are computed under: the decoder's (through RotaryEmbedding.angles)
    # and the fallback inside the fused functions
    monkeypatch.setattr(rotary, "rotary_angles", counting)
    monkeypatch.setattr(fused, "rotary_angles", counting)
    llm.engine.runner.prepare = counting_prepare
    got = llm.generate([[5, 6, 7, 8], [9, 10]], params)
    assert [o.token_ids for o in got] == [o.token_ids for o in expected]
    assert forwards and len(calls) == len(forwards)
    llm.close()


def test_kv_bytes_per_token_are_the_pools_own(tmp_path):
    """The bound's KV bytes are what the pool holds a position: 4 bytes a value in float32, one
    in a float8 pool (they were the first weight's element size, 4, under fp8_e4m3 too)."""
    from minisgl_core.testing import cpu_llm, make_model_dir

    model_dir = make_model_dir(tmp_path / "m", "LlamaForCausalLM", num_hidden_layers=2)
    for kv_dtype, value_bytes in (("auto", 4), ("fp8_e4m3", 1)):
        llm = cpu_llm(model_dir, cache="naive", kv_cache_dtype=kv_dtype)
        pool = llm.engine.runner.kv_cache
        per_token = pool.buffer.numel() * pool.buffer.element_size() // pool.num_slots
        spec = llm.engine.runner.model.kv_spec
        assert bench_cpu.kv_bytes_per_token(llm.engine.runner) == per_token
        assert per_token == 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * value_bytes
        llm.close()


class _Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(100, 8)
        self.proj = torch.nn.Linear(8, 8, bias=False)
        self.lm_head = torch.nn.Linear(8, 100, bias=False)
        self.lm_head.weight = self.embed_tokens.weight


class _Untied(_Tied):
    def __init__(self) -> None:
        super().__init__()
        self.lm_head = torch.nn.Linear(8, 100, bias=False)


def test_weight_bytes_count_a_tied_table_once_and_skip_an_untied_input_table():
    table, proj = 100 * 8 * 4, 8 * 8 * 4
    assert bench_cpu.weight_bytes_per_step(_Tied()) == table + proj  # read once, as the lm_head
    assert bench_cpu.weight_bytes_per_step(_Untied()) == proj + table  # lm_head; embedding rows only


def test_bound_is_bandwidth_over_bytes_per_step():
    # one sequence, no KV: 1 GB of weights at 10 GB/s is 10 steps a second
    assert bench_cpu.bound_tok_per_s(10.0, 10**9, 0, [5], 8) == 10.0
    # 8 sequences share the weight read; KV at the mean context (prompt + half the new tokens)
    got = bench_cpu.bound_tok_per_s(10.0, 10**9, 1000, [100] * 8, 200)
    assert abs(got - 8 * 10e9 / (10**9 + 8 * 200 * 1000)) < 1e-6


def test_greedy_comparison_stops_at_our_first_eos():
    eos = {2}
    assert bench_cpu._same_until_eos([5, 6, 2, 9, 9], [5, 6, 7, 8, 1], eos)  # theirs masks EOS
    assert not bench_cpu._same_until_eos([5, 6, 2, 9], [5, 7, 3, 3], eos)
    assert bench_cpu._same_until_eos([5, 6, 7], [5, 6, 7], eos)
    assert not bench_cpu._same_until_eos([5, 6, 7], [5, 6, 8], eos)


def test_markdown_table_has_both_engines_and_the_bound():
    result = {
        "threads": 2, "weight_bytes_per_step": 538_000_000, "bandwidth_read_gbs": 14.5,
        "bandwidth_copy_gbs": 16.0, "new_tokens": 32, "rounds": 3,
        "rows": [{
            "batch_size": 8, "bound_tok_per_s": 200.0, "ratio": 2.0, "greedy_equal": True,
            "minisgl": {"tok_per_s": [40.0, 42.0], "median": 41.0},
            "transformers": {"tok_per_s": [20.0, 21.0], "median": 20.5},
        }],
    }  # fmt: skip
    table = bench_cpu.markdown_table(result)
    assert "| 8 | **41.0** (40.0, 42.0) | 200.0 | 20% | 20.5 (20.0, 21.0) | **2.0×** | yes |" in table
    assert "read bandwidth 14.5 GB/s" in table


def test_memory_bandwidth_is_measured():
    bw = bench_cpu.memory_bandwidth(size_mib=64, repeats=2)
    assert 0.1 < bw.read < 10_000 and 0.1 < bw.copy < 10_000
