"""ModelInfo: what the ready handshake said about the served model, and what the routes derive
from it once (max_model_len), answered without an engine."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from minisgl_core.server.app import create_app
from minisgl_core.server.state import ModelInfo, ServerState


@pytest.mark.parametrize(("context", "pool", "longest"), [(2048, 16384, 2048), (2048, 1024, 1024)])
def test_max_model_len_is_the_context_or_the_smaller_kv_pool(context, pool, longest):
    info = ModelInfo(name="m", path="m", max_context_len=context, kv_capacity_tokens=pool, vocab_size=1024)
    assert info.max_model_len == longest
    client = TestClient(create_app(ServerState(endpoints=None, model=info)))
    assert client.get("/v1/models").json()["data"][0]["max_model_len"] == longest
