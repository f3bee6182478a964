"""Runs the suite's CUDA-graph test (and the rest of the suite) on a GPU with a test-only,
graph-capable variant of the torch backend, so the graph test itself is known to work before
kernel backends rely on it. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch
from minisgl_plugin_torch.backend import TorchAttentionBackend, TorchAttentionMetadata

from minisgl_core.api import ForwardBatch
from minisgl_core.testing.attention_suite import AttentionBackendSuite

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


class GraphCapableTorchBackend(TorchAttentionBackend):
    """Decode metadata padded to max_context_len in fixed buffers, so captured shapes never change.
    Plain decode only: its buffers hold no cascade groups, so it does not claim "cascade". With a
    sliding window, the window's mask in a fixed buffer too."""

    capabilities = (TorchAttentionBackend.capabilities | {"cuda_graph"}) - {"cascade"}

    def init_graph_capture(self, max_batch_size: int) -> None:
        config = self.config
        self.graph_buffers = TorchAttentionMetadata(
            kv_slots=torch.zeros(
                max_batch_size, config.max_context_len, dtype=torch.int64, device=config.device
            ),
            mask=torch.zeros(
                max_batch_size, 1, 1, config.max_context_len, dtype=torch.bool, device=config.device
            ),
            token_seq=torch.arange(max_batch_size, device=config.device),
            token_offset=torch.zeros(max_batch_size, dtype=torch.int64, device=config.device),
            max_extend=1,
        )
        #: the graph's tensors: kv_slots, mask, token_seq, token_offset, and window_mask with a window
        self.graph_tensors = list(self.graph_buffers[:4])
        if config.sliding_window:
            self.graph_tensors.append(torch.zeros_like(self.graph_buffers.mask))

    def prepare_capture(self, batch: ForwardBatch) -> None:
        self.refresh_buffers(batch)
        bs = batch.batch_size
        views = [t[:bs] for t in self.graph_tensors]
        window_mask = views[4] if len(views) > 4 else None
        batch.attn_metadata = TorchAttentionMetadata(*views[:4], max_extend=1, window_mask=window_mask)

    def prepare_replay(self, batch: ForwardBatch) -> None:
        self.refresh_buffers(batch)

    def refresh_buffers(self, batch: ForwardBatch) -> None:
        fresh = self.build_metadata(batch, max_len=self.config.max_context_len)
        values = [*fresh[:4], fresh.window_mask] if self.config.sliding_window else fresh[:4]
        for buffer, value in zip(self.graph_tensors, values, strict=True):
            buffer[: value.shape[0]].copy_(value)


class TestGraphProtocolFloat32(AttentionBackendSuite):
    backend_cls = GraphCapableTorchBackend
    device = "cuda"
    dtype = torch.float32
    gqa_ratios = (1, 8)


class TestGraphProtocolBfloat16(TestGraphProtocolFloat32):
    dtype = torch.bfloat16


class StaleReplay(GraphCapableTorchBackend):
    """Forgets to refresh its buffers before a replay: the graph keeps the dummy batch's layout."""

    def prepare_replay(self, batch: ForwardBatch) -> None:
        pass


def test_graph_test_rejects_stale_replay() -> None:
    suite = type("StaleSuite", (TestGraphProtocolFloat32,), {"backend_cls": StaleReplay})()
    with pytest.raises(AssertionError):
        suite.test_cuda_graph_decode(suite.shapes()[0], torch.Generator().manual_seed(0))
