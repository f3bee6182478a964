"""The fi backend on a CUDA GPU: the attention conformance suite in bfloat16, plus several captured
decode graph sizes sharing the backend's fixed index buffers. Skipped without CUDA or FlashInfer."""

from __future__ import annotations

import pytest
import torch
from minisgl_plugin_fi.backend import FlashInferBackend

from minisgl_core.testing.attention_suite import LAYER, AttentionBackendSuite, Shape
from minisgl_core.testing.paged import store_prefixes


class TestFlashInferBackend(AttentionBackendSuite):
    backend_cls = FlashInferBackend
    device = "cuda"
    dtype = torch.bfloat16
    # bf16 inputs, bf16 output and bf16 probabilities in P @ V: about 3 significant digits.
    atol = 2e-2
    rtol = 2e-2

    def test_graph_sizes_share_buffers(self, generator: torch.Generator) -> None:
        """Graphs of two batch sizes, captured once, replayed alternately on fresh batches."""
        sizes, shape = (1, 3), Shape(2, 4, 128, 16)
        real = {n: [self.randoms(generator, n, 1, self.max_seq_len) for _ in range(2)] for n in sizes}
        capacities = [length for n in sizes for lens in real[n] for length in lens] + [1] * sum(sizes)
        problem = self.make_problem(shape, capacities, generator)
        backend, config = problem.backend, problem.config
        backend.init_graph_capture(max(sizes))
        graphs = {}
        next_row = len(capacities) - sum(sizes)
        for n in sizes:  # dummy batches on the spare length-1 rows at the end
            rows = range(next_row, next_row + n)
            next_row += n
            dummy = self.batch(
                problem, generator, [1] * n, [1] * n, rows=rows, is_prefill=False, captured=True
            )
            static = [
                torch.zeros(n, h, config.head_dim, dtype=self.dtype, device=self.device)
                for h in (config.num_qo_heads, config.num_kv_heads, config.num_kv_heads)
            ]
            backend.prepare_capture(dummy)
            backend.forward(*static, LAYER, dummy)  # warm-up outside the graph
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = backend.forward(*static, LAYER, dummy)
            graphs[n] = (graph, dummy, static, out)
        assert sorted(backend.graph_wrappers) == list(sizes)

        first_row = {n: sum(len(lens) for m in sizes[: sizes.index(n)] for lens in real[m]) for n in sizes}
        for part in range(2):
            for n in sizes:
                graph, dummy, static, out = graphs[n]
                rows = list(range(first_row[n] + part * n, first_row[n] + (part + 1) * n))
                batch = self.batch(
                    problem, generator, real[n][part], [1] * n, rows=rows, is_prefill=False, captured=True
                )
                keys, values = ([d[r] for r in rows] for d in (problem.keys[LAYER], problem.values[LAYER]))
                store_prefixes(config.kv_cache, LAYER, batch, keys, values)
                inputs = self.step_inputs(problem, generator, batch, LAYER, rows)
                dummy.out_cache_loc.copy_(batch.out_cache_loc)
                for buffer, value in zip(static, inputs, strict=True):
                    buffer.copy_(value)
                backend.prepare_replay(batch)
                pool_before = config.kv_cache.buffer.clone()
                graph.replay()
                torch.cuda.synchronize()
                self.check_step(problem, batch, LAYER, rows, inputs, out.clone(), pool_before)

    def test_graph_size_errors(self, generator: torch.Generator) -> None:
        problem = self.make_problem(Shape(2, 2, 128, 16), [5, 6, 7], generator)
        backend = problem.backend
        batch = self.batch(problem, generator, [5, 6, 7], [1, 1, 1], is_prefill=False, captured=True)
        with pytest.raises(RuntimeError, match="init_graph_capture"):
            backend.prepare_capture(batch)
        backend.init_graph_capture(2)
        with pytest.raises(ValueError, match="max_batch_size"):
            backend.prepare_capture(batch)
        with pytest.raises(RuntimeError, match="no decode graph"):
            backend.prepare_replay(batch)
